"""A detached run's job step (``launch --detach``): its output kept in files of the run, so that
a supervisor killed loses nothing, and the step taken back by ``launch attach``.

A foreground run's srun dies with its launcher (PR_SET_PDEATHSIG) and takes its step with it.
A detached run's srun runs under a holder (``HOLDER``: ``sh``, its own session, no
PR_SET_PDEATHSIG) that outlives the supervisor: srun's stdout (the task's output, its stderr
joined on the node) goes to ``RUN_DIR/output/attempt-N/process-NNN.out``, srun's own stderr
(how its task ended, a node failure) and the holder's report of srun's exit code
(``podlaunch-srun-exit N``, the file's last line) to ``process-NNN.srun`` beside it; both
0600, appended, written only by srun and its holder (the task cannot write into the second).
The supervisor follows the output file by offset (``read_to``, journaled with the log's size,
``launcher.rundir.journal``) and reads the second once srun has ended.

Taken back (``adopted``): the holder is proven by its pid, start ticks and owner (a pid reused
since is another process, never signalled); the step by its id and name in the job, which the
session has proven the run's own (``SlurmSession.adopt``); the log is cut back to the size the
journal kept and the output read again from the offset beside it. A step that ended while
nobody watched is classified from the holder's report and srun's lines, read against the
job's state (``SlurmSession.judge``); a holder gone without a report is lost.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from typing import Iterator

from launcher import plan as planning
from launcher import owned, proctl
from launcher.backends.slurm.commands import scrubbed
from launcher.backends.slurm.workers import EOF_WAIT_S, SrunWorker
from launcher.console import lines
from launcher.errors import LaunchError
from launcher.remote import tail
from launcher.ends import Exit, Lost
from worker import contract
from worker.contract import causes, runfiles, wire

REPORT = re.compile(r"^podlaunch-srun-exit (\d+)$")
# srun a child of sh, which reports its exit code; a signal to the holder's group reaches srun
# (which cancels its step on SIGTERM) while sh's own trap keeps it alive to report
HOLDER = ("sh", "-c", 'trap : HUP INT TERM; "$@"; code=$?; echo "podlaunch-srun-exit $code" >&2',
          "podlaunch-srun")
ASK_STEP_EVERY_S = 5.0


def srun_path(out_path: str) -> str:
    """Where srun's own messages and its holder's report go, beside the step's output."""
    return out_path[:-len(".out")] + ".srun"


class FiledWorker(SrunWorker):
    """A detached run's step: started (``started``) or taken back (``adopted``)."""

    def __init__(self, plan, job_id: str, step_name: str, slurm, judge=None):
        # super().__init__ starts a foreground srun: the state it keeps is set here instead
        self.plan, self.job_id, self.step_name, self.slurm, self.judge = (
            plan, job_id, step_name, slurm, judge)
        self._step: str | None = None
        self._ended: Exit | None = None
        self.failed_node: str | None = None
        self.out_path = planning.output_path(plan.run_dir, plan.process_id, plan.attempt)
        self.err_path = srun_path(self.out_path)
        self.read_to = self.err_from = 0  # how far the output was logged; where srun's lines begin
        self.pid, self.since = 0, None  # the holder's
        self._proc: subprocess.Popen | None = None
        self._early: list = []
        self._said: list | None = None  # srun's lines, once it has ended
        self._report: int | None = None
        self._eof = threading.Event()
        self._gone_at: float | None = None
        self._asked_at = -float("inf")

    @classmethod
    def started(cls, plan, job_id: str, step_name: str, argv: list, slurm, judge=None,
                rendezvous: bool = False) -> "FiledWorker":
        w = cls(plan, job_id, step_name, slurm, judge)
        folder = os.path.dirname(w.out_path)
        env = scrubbed(None, plan.env, drop=plan.unset)
        if rendezvous:
            env[contract.RENDEZVOUS] = "stdin"
        out = err = None
        try:
            for path in (os.path.dirname(folder), folder):
                os.makedirs(path, mode=0o700, exist_ok=True)  # owner-only, as the logs
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            out, err = runfiles.opener(w.out_path, flags), runfiles.opener(w.err_path, flags)
            # an attempt started again (its supervisor killed while starting it): what its
            # strays wrote stays, and is not this step's
            w.read_to, w.err_from = os.fstat(out).st_size, os.fstat(err).st_size
            w._proc = subprocess.Popen(
                list(HOLDER) + list(argv), env=env,
                stdin=subprocess.PIPE if rendezvous else subprocess.DEVNULL, stdout=out,
                stderr=err, start_new_session=True, text=True, encoding="utf-8",
                errors="replace", bufsize=1)
        except OSError as exc:
            raise LaunchError(f"cannot start srun for process_id {plan.process_id}: "
                              f"{causes.exhausted(exc) or exc.strerror}") from None
        finally:
            for fd in (out, err):
                if fd is not None:
                    os.close(fd)
        w.pid, w.since = w._proc.pid, proctl.start_ticks(w._proc.pid)
        return w

    @classmethod
    def adopted(cls, plan, record: dict, slurm, judge, step: str | None) -> "FiledWorker":
        """The step a killed supervisor started, from its journal ``record`` (``step``: its id
        as the session found it in the job, or None once it has ended)."""
        w = cls(plan, str(record["job_id"]), str(record["step_name"]), slurm, judge)
        w.pid, w.since = int(record["pid"]), record.get("since")
        w.read_to, w.err_from = int(record.get("offset") or 0), int(record.get("err_from") or 0)
        # its holder is signalled only if it shows the run's directory and secret now
        # (``owned.shows_run``); the step itself was proven by Slurm (``adoption``)
        w._proven = proctl.is_process(w.pid, w.since) and owned.shows_run(
            w.pid, os.environ.get(owned.SECRET_VAR))
        w._step = step
        if isinstance(record.get("logged"), int):  # what follows the offset is read again
            tail.cut(plan.log_path, record["logged"])
        return w

    def _alive(self) -> bool:
        """Whether the holder runs: this supervisor's child, or the process the journal names
        (this user's, started at the recorded tick, not a zombie)."""
        if self._proc is not None:
            return self._proc.poll() is None
        return getattr(self, "_proven", False) and proctl.is_process(self.pid, self.since)

    def facts(self) -> dict | None:
        for line, end in tail.lines(self.out_path, self.read_to, self._alive):
            parsed = wire.parse(line)
            if isinstance(parsed, wire.Facts) and parsed.facts is not None:
                self.read_to = end
                return parsed.facts
            self._early.append(line)
        return None

    def early_lines(self) -> list:
        return list(self._early) + self._srun_said()

    def lines(self) -> Iterator[str]:
        try:
            early, self._early = self._early, []
            yield from early
            for line, end in tail.lines(self.out_path, self.read_to, self._alive):
                if end is None:  # a part of a long line, more to follow: never held whole
                    yield lines.Piece(line)
                    continue
                yield line
                self.read_to = end
            yield from self._srun_said()
        finally:
            self._eof.set()

    def _srun_said(self) -> list:
        """srun's lines and its holder's report, read once the holder has ended (none before)."""
        if self._said is None and not self._alive():
            try:
                with open(self.err_path, "rb", opener=runfiles.opener) as f:
                    f.seek(self.err_from)
                    text = f.read(1 << 20).decode("utf-8", "replace")
            except OSError:
                text = ""
            said = []
            for line in text.splitlines():
                report = REPORT.match(line)
                if report:
                    self._report = int(report.group(1))
                    continue
                self._said_by_srun(line)
                said.append(line)
            self._said = said
        return list(self._said or ())

    def poll(self) -> Exit | None:
        if self._alive():
            return None
        self._gone_at = self._gone_at or time.monotonic()
        if not self._eof.is_set() and time.monotonic() - self._gone_at < EOF_WAIT_S:
            return None  # its output is read to the end first
        self._srun_said()
        if self._report is None:
            return Lost(f"the srun of process_id {self.plan.process_id} (its holder, pid "
                        f"{self.pid}) ended without reporting its exit code")
        return self._verdict(self._report)

    def step(self) -> str | None:
        if self._proc is None:  # taken back: the step was found in the job then, or had ended
            return self._step
        return super().step()

    def _holder_group(self) -> int | None:
        """The holder's process group (its own session's), while it is proven alive."""
        if not self._alive():
            return None
        fields = proctl.stat_fields(self.pid)
        return self.pid if fields is not None and fields[2] == self.pid else None

    def terminate(self) -> None:
        step = self.step()
        if step is not None:
            self.slurm.cancel(step, signal="TERM")
            return
        group = self._holder_group()
        if group is not None:  # not registered yet: srun cancels what it started
            proctl.signal_group(group, (signal.SIGTERM,))

    def kill(self) -> None:
        step = self.step()
        if step is not None:
            self.slurm.cancel(step, signal="KILL")
        group = self._holder_group()
        if group is not None:  # srun: cancel the step, then exit (its holder reports it)
            proctl.signal_group(group, (signal.SIGTERM,))

    def journal_entry(self) -> dict:
        """What a supervisor that takes the run back needs of this step (``launcher.rundir.journal``
        adds the offset and the log's size)."""
        if self._step is None and self._proc is not None and self._alive() \
                and time.monotonic() - self._asked_at >= ASK_STEP_EVERY_S:
            self._asked_at = time.monotonic()
            self.step()
        return {"process_id": self.plan.process_id, "job_id": self.job_id,
                "step": self._step, "step_name": self.step_name, "node": self.plan.host,
                "pid": self.pid, "since": self.since, "out": self.out_path,
                "err_from": self.err_from}
