"""Taking back a detached local run's processes after its supervisor was killed (``launch attach``).

A detached run's wrapper does not die with its supervisor, and its worker writes its output
into the run directory (``localworker.LocalWorker`` with ``out_path``). A new supervisor finds each
process from the journal (``launcher.run.journal``): its wrapper, proven by its pid, its start
ticks and its owner before anything is signalled (a pid reused since is another process,
never signalled); its worker's process group, proven the wrapper's own child leading its
group; and its output file, read again from where the killed supervisor had logged it. A
process that ended meanwhile is classified from its wrapper's exit report in that file;
one whose wrapper is gone without a report is lost.
"""

from __future__ import annotations

import os
import signal
import threading

from launcher import proctl
from launcher.backends.localworker import LocalWorker
from launcher.errors import Problem, SpecError
from launcher.plan import Plan, ProcessPlan
from launcher.remote import tail, wrapper
from launcher.state import Exit, Lost, exit_of
from worker import contract
from worker.contract import signals


class AdoptedWorker(LocalWorker):
    """A process of this machine that a killed supervisor started: not this process's child."""

    def __init__(self, plan: ProcessPlan, record: dict):  # noqa: super().__init__ starts one
        self.plan = plan
        self._wrapper, self.since = int(record["pid"]), record.get("since")
        self._token, self.out_path = str(record["token"]), str(record["out"])
        self.read_to = int(record.get("offset") or 0)
        self._reported: str | None = None
        self._eof = threading.Event()
        self.pgid = None
        if isinstance(record.get("logged"), int):  # what follows the offset is read again
            tail.cut(plan.log_path, record["logged"])
        if record.get("pgid") is not None and self._alive():
            self.pgid = self._own_group(str(record["pgid"]))

    @property
    def pid(self) -> int:
        return self._wrapper

    def _alive(self) -> bool:
        """Whether the wrapper is still the process the journal names: this user's, started
        at the recorded tick, and not a zombie."""
        return proctl.is_process(self._wrapper, self.since)

    def lines(self):
        try:
            yield from self._tailed(self._alive)
        finally:
            self._eof.set()

    def poll(self) -> Exit | None:
        if self._reported is None:
            if self._alive():
                return None
            self._eof.wait(2.0)  # the report is the file's last line
        if self._reported is not None:
            proctl.wait_until(lambda: not self._alive(), 2.0)  # its last line said: it ends
            exit_code, sig, at = wrapper.parse_exit_report(self._reported)
            return exit_of(exit_code, sig, at)
        return Lost(f"its wrapper (pid {self._wrapper}) ended without an exit report while no "
                    "supervisor watched")

    def _group(self) -> int | None:
        """The worker's process group, proven again now (None: not provably ours)."""
        if self.pgid is None or not self._alive():
            return None
        return self._own_group(str(self.pgid))

    def terminate(self) -> None:
        group = self._group()
        if group is not None:
            proctl.signal_group(group, (signal.SIGTERM, signal.SIGCONT))
        elif self._alive():  # the wrapper passes it on
            proctl.signal_pid(self._wrapper, (signal.SIGTERM,))

    def kill(self) -> None:
        group = self._group()
        if group is not None:
            proctl.signal_group(group, (signal.SIGKILL,))
        if self._alive():
            proctl.kill_descendants(self._wrapper)

    def abandon(self) -> list:
        self.kill()
        return []

    def wait_gone(self, pids: list, timeout_s: float) -> bool:
        return bool(proctl.wait_until(lambda: not self._alive(), timeout_s))

    def stopped(self) -> bool:
        group = self._group()
        return group is not None and proctl.is_stopped(group)

    def dump_stacks(self) -> None:
        group = self._group()
        if group is not None:
            proctl.signal_pid(group, (signals.STACKS_SIGNAL,))


def adopt(plan: Plan, records: list) -> list:
    """One ``AdoptedWorker`` per process of ``plan``, from the journal's ``records``.

    Raises:
      SpecError: the records do not name every process of the plan once; nothing was signalled.
    """
    by_id = {}
    for record in records:
        if isinstance(record, dict) and isinstance(record.get("process_id"), int):
            by_id[record["process_id"]] = record
    missing = [p.process_id for p in plan.processes if p.process_id not in by_id]
    if missing:
        raise SpecError([Problem("RUN", None, "", (
            f"the run's journal names no process {', '.join(map(str, missing))} of its attempt "
            f"{plan.processes[0].attempt} (its supervisor was killed while starting them?): "
            "they cannot be taken back; stop what is left and `launch JOB.yaml --resume RUN`"))])
    try:
        return [AdoptedWorker(p, by_id[p.process_id]) for p in plan.processes]
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError([Problem("RUN", None, "", f"the run's journal is not usable ({exc!r})")]) \
            from None


def stop_strays(run_dir: str, timeout_s: float = proctl.KILL_WAIT_S) -> list:
    """SIGKILL every worker of this user whose run directory (its environment's
    ``contract.RUN_DIR``) is ``run_dir``, and wait until they and their wrappers are gone;
    returns the workers' pids."""
    item = f"{contract.RUN_DIR}={run_dir}".encode()
    found = []
    for pid in proctl.pids():
        if pid == os.getpid() or item not in proctl.environ(pid):
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid == os.getuid():
                found.append(pid)
        except OSError:
            continue
    # and their wrappers, which write a last line into the output file as their worker ends:
    # gone before an attempt started again reads that file
    wrappers = [fields[1] for fields in map(proctl.stat_fields, found) if fields is not None
                and "launcher.remote.wrapper" in proctl.cmdline(fields[1], 200)]
    for pid in found:
        proctl.signal_pid(pid, (signal.SIGKILL,))
    proctl.wait_until(lambda: all(proctl.state(p) in (None, "Z") for p in found + wrappers),
                      timeout_s)
    return found
