"""Taking back a detached local run's processes after its supervisor was killed (``launch attach``).

A detached run's wrapper does not die with its supervisor, and its worker writes its output
into the run directory (``launcher.backends.local.worker.LocalWorker`` with ``out_path``).
A new supervisor finds each process from the journal (``launcher.rundir.journal``, sealed): its wrapper, proven before anything
is signalled by its pid, its start ticks, its owner and its environment, which must show the
run's directory and secret (``owned.shows_run``: a reused pid, a process of the user's that a
journal names, a copied run's process is never signalled); its worker's process group, proven
the wrapper's own child leading its group; and its output file, the run's own path for the
process (``plan.output_path``), read again from where the killed supervisor had logged it. A
process that ended meanwhile is classified from its wrapper's exit report in that file;
one whose wrapper is gone without a report is lost.
"""

from __future__ import annotations

import os
import signal
import threading

from launcher import owned, proctl
from launcher.backends.base import Reattach
from launcher.backends.local.worker import LocalWorker
from launcher.errors import Problem, SpecError
from launcher.plan import Plan, ProcessPlan, output_path
from launcher.remote import tail, wrapper
from launcher.ends import Exit, Lost, exit_of
from worker.contract import signals


class AdoptedWorker(LocalWorker):
    """A process of this machine that a killed supervisor started: not this process's child."""

    def __init__(self, plan: ProcessPlan, record: dict):  # noqa: super().__init__ starts one
        self.plan = plan
        self._wrapper, self.since = _whole(record["pid"]), _whole(record.get("since"))
        self._token = str(record["token"])
        self.out_path = output_path(plan.run_dir, plan.process_id, plan.attempt)
        self.read_to = _whole(record.get("offset") or 0)
        self._reported: str | None = None
        self._eof = threading.Event()
        self.pgid = None
        # the proof, once: a process that shows the run's secret and directory now is the
        # run's for as long as it is the process of that pid and start tick
        self._proven = proctl.is_process(self._wrapper, self.since) and owned.shows_run(
            self._wrapper, os.environ.get(owned.SECRET_VAR))
        if isinstance(record.get("logged"), int):  # what follows the offset is read again
            tail.cut(plan.log_path, _whole(record["logged"]))
        if record.get("pgid") is not None and self._alive():
            self.pgid = self._own_group(str(_whole(record["pgid"])))

    @property
    def pid(self) -> int:
        return self._wrapper

    def _alive(self) -> bool:
        """Whether the wrapper is still the process the journal names, proven the run's when
        taken back (``owned.shows_run``): this user's, started at the recorded tick, and not
        a zombie."""
        return self._proven and proctl.is_process(self._wrapper, self.since)

    def lines(self):
        try:
            yield from self._tailed(self._alive)
        except OSError:  # no output file of the run's own (never one the journal names)
            return
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
        if not self._proven and proctl.is_process(self._wrapper, self.since):
            return Lost(f"pid {self._wrapper}, its wrapper as the journal names it, does not show "
                        "the run's directory and secret: not provably the run's, so it was "
                        "neither taken back nor signalled")
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
            "they cannot be taken back; stop what is left and `launch resume RUN`"))])
    try:
        return [AdoptedWorker(p, by_id[p.process_id]) for p in plan.processes]
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError([Problem("RUN", None, "", f"the run's journal is not usable ({exc!r})")]) \
            from None


def _whole(value) -> int:
    """A journal's number, which must be an int (a bool or text is not)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not a whole number")
    return value


def stop_strays(run_dir: str, timeout_s: float = proctl.KILL_WAIT_S) -> list:
    """SIGKILL every worker of this user that shows the run ``run_dir`` (``owned.shows_run``: it
    carries the run's secret, derived from that directory), and wait until they and their
    wrappers are gone; returns the workers' pids."""
    secret = os.environ.get(owned.SECRET_VAR)
    found = [pid for pid in proctl.pids() if pid != os.getpid()
             and owned.shows_run(pid, secret)
             and "launcher.remote.wrapper" not in proctl.cmdline(pid, 200)]
    # and their wrappers, which write a last line into the output file as their worker ends:
    # gone before an attempt started again reads that file
    wrappers = [fields[1] for fields in map(proctl.stat_fields, found) if fields is not None
                and "launcher.remote.wrapper" in proctl.cmdline(fields[1], 200)]
    for pid in found:
        proctl.signal_pid(pid, (signal.SIGKILL,))
    proctl.wait_until(lambda: all(proctl.state(p) in (None, "Z") for p in found + wrappers),
                      timeout_s)
    return found


class LocalReattach(Reattach):
    """A local run's part in being taken back: its processes, each proven from the journal
    (``adopt``), and those no journal names stopped (``stop_strays``); no handle."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir

    def adopt(self, plan: Plan, records: list) -> list:
        return adopt(plan, records)

    def stop_strays(self) -> list:
        return stop_strays(self.run_dir)
