"""A Slurm job's life as podlaunch follows it: its state read as an enum, and the three
waits (until it runs, until a failure settles, until it is gone), on an injected clock.

``Phase`` names what a ``scontrol show job`` record means for a launch (Slurm's own
``JobState`` strings stay in the record): RUNNING; WAITING (pending, requeued, suspended:
it may run later); SETTLING (COMPLETING, or RUNNING with a preemption announced: the next
state is coming); RESUBMIT (PREEMPTED with PreemptMode=CANCEL, NODE_FAIL, BOOT_FAIL: a new
submission may run); TIMEOUT; GONE (out of the queue); ENDED (any other end: cancelled by
someone, failed, completed). A task that ended as a SIGTERM ends it while its running job
is within the ``--signal`` lead of its time limit (``cluster.time_limit_lead_s``) ended by
the limit's notice: final, like TIMEOUT. ``JobLifecycle`` takes ``clock`` and ``sleep`` so the tests
follow a job through scripted records in fake time, no Slurm needed
(``tests/backends/slurm/test_slurm_facts.py``).
"""

from __future__ import annotations

import datetime
import enum
import signal
import time
from typing import Callable

from launcher.backends.slurm.commands import RESUBMIT, WAIT
from launcher.errors import LaunchError
from launcher.ends import Exit, Exited, Final, Killed, Lost, Preempted


class Phase(enum.Enum):
    RUNNING = "running"
    WAITING = "waiting"
    SETTLING = "settling"
    RESUBMIT = "resubmit"
    TIMEOUT = "timeout"
    GONE = "gone"
    ENDED = "ended"


def preempting(record: dict | None) -> bool:
    """Whether Slurm has announced the job's preemption (its grace time runs)."""
    return record is not None and record.get("PreemptTime", "None") not in ("None", "")


def phase(record: dict | None) -> Phase:
    """What a ``scontrol show job`` record (None: gone) means for the launch."""
    if record is None:
        return Phase.GONE
    state = record.get("JobState", "?")
    if state == "TIMEOUT" or record.get("Reason") == "TimeLimit":
        return Phase.TIMEOUT
    if "COMPLETING" in state or (state == "RUNNING" and preempting(record)):
        return Phase.SETTLING
    if state == "RUNNING":
        return Phase.RUNNING
    if state in WAIT:
        return Phase.WAITING
    if state in RESUBMIT:
        return Phase.RESUBMIT
    return Phase.ENDED


# Slurm may send a --signal up to 60 s before the time asked (its event resolution: sbatch(1))
SIGNAL_SLACK_S = 60.0


def seconds_left(record: dict | None, now: datetime.datetime | None = None) -> float | None:
    """Seconds until a running job's ``EndTime`` (its time limit), or None (no limit known)."""
    try:
        end = datetime.datetime.fromisoformat(record["EndTime"])
    except (TypeError, KeyError, ValueError):
        return None
    return (end - (now or datetime.datetime.now())).total_seconds()


def notice_exit(ended: Exit) -> bool:
    """Whether a task ended as a SIGTERM notice ends it: killed by SIGTERM, or exit 143 (the
    worker's own exit after the agreed step, or a shell's report of the signal)."""
    return ((isinstance(ended, Killed) and ended.signal == signal.SIGTERM)
            or (isinstance(ended, Exited) and ended.code == 128 + signal.SIGTERM))


def state_text(record: dict | None) -> str:
    return "GONE" if record is None else record.get("JobState", "?")


class JobLifecycle:
    """Follows one job (``job_id``) through ``read`` (``Slurm.job``).

    Args:
      read: job id -> its record, or None once it has left the queue.
      poll_s: seconds between reads.
      clock, sleep: monotonic seconds and a way to let them pass (real ones by default).
    """

    def __init__(self, read: Callable[[str], dict | None], poll_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.read, self.poll_s, self.clock, self.sleep = read, poll_s, clock, sleep

    def wait_running(self, job_id: str, pending: Callable[[str], None] = lambda text: None) -> dict:
        """Until the job runs: its record then. ``pending`` gets ``pending (Reason)`` each poll.

        Raises:
          LaunchError: it ended before it ran (named with its state and reason).
        """
        while True:
            record = self.read(job_id)
            if record is not None and record.get("JobState") == "RUNNING":  # preempted or not
                return record
            if phase(record) is not Phase.WAITING:
                raise LaunchError(f"Slurm job {job_id} ended before it ran: {state_text(record)}"
                                  + (f" ({record.get('Reason')})" if record else ""))
            pending(f"pending ({record.get('Reason', '?')})")
            self.sleep(self.poll_s)

    def settled(self, job_id: str, limit_s: float) -> dict | None:
        """The job's record once it is no longer SETTLING, or after ``limit_s`` seconds."""
        deadline = self.clock() + limit_s
        record = self.read(job_id)
        while phase(record) is Phase.SETTLING and self.clock() < deadline:
            self.sleep(self.poll_s)
            record = self.read(job_id)
        return record

    def judge(self, job_id: str, ended: Exit, resume_hint: str, limit_s: float = 30.0,
              lead_s: float = 0.0, time_limit: bool = False) -> Exit:
        """A failed step read against its job: a time limit is ``Final``, a job being
        preempted (or PREEMPTED) is ``Preempted``, one otherwise gone is ``Lost``; else the step's own end. A job Slurm is ending is
        waited out (``limit_s``) for its state; a read that fails leaves ``ended`` as it is.
        ``time_limit``: slurmstepd said it cancelled the step at its time limit, which is the
        verdict whatever the job's state reads (still RUNNING as its tasks are killed)."""
        deadline = self.clock() + limit_s
        try:
            record = self.read(job_id)
            while record and "COMPLETING" in record.get("JobState", "") and self.clock() < deadline:
                self.sleep(self.poll_s)
                record = self.read(job_id)
        except LaunchError:
            record = None
            if not time_limit:
                return ended
        now = phase(record)
        if now is Phase.TIMEOUT or time_limit:
            return Final(f"Slurm job {job_id} reached its time limit (TIMEOUT; task {ended}): "
                         f"raise cluster.time_limit and continue with --resume {resume_hint}")
        if now is not Phase.RUNNING:
            state = state_text(record)
            if preempting(record) or "PREEMPTED" in state:  # requeued after a preemption too
                what = "being preempted" if now is Phase.SETTLING else state
                return Preempted(f"Slurm job {job_id} is {what}; task {ended}")
            if now is Phase.ENDED:  # cancelled by someone else, failed, completed
                return Final(f"Slurm job {job_id} ended ({state}; task {ended}): it is not "
                             f"resubmitted; continue with --resume {resume_hint}")
            return Lost(f"Slurm job {job_id} is {state}; task {ended}")
        left = seconds_left(record)
        if (lead_s and left is not None and left <= lead_s + SIGNAL_SLACK_S
                and notice_exit(ended)):
            return Final(f"Slurm job {job_id} is {left:.0f} s from its time limit, and its "
                         f"notice (--signal=TERM@{lead_s:g}) stopped the task ({ended}): raise "
                         f"cluster.time_limit and continue with --resume {resume_hint}")
        return ended

    def gone(self, job_id: str, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the job to leave RUNNING, COMPLETING and the waiting
        states (after a cancel); whether it did."""
        deadline = self.clock() + timeout_s
        while self.clock() < deadline:
            if phase(self.read(job_id)) in (Phase.GONE, Phase.ENDED, Phase.TIMEOUT, Phase.RESUBMIT):
                return True
            self.sleep(0.1)
        return False
