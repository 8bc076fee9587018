"""Failure classes: what kind of fault ended an attempt, told from its cause, not its consequences.

Every failed attempt gets one class, and each class has its own restart budget in the
spec's ``restarts`` section (``Budgets``), after the field's practice: Marin's orchestrator
retries preemptions and not program failures by default, SkyPilot counts restarts for
listed exit codes apart from ``max_restarts_on_errors``, xpk restarts on system failures
by default and not on user errors (xpk PR #308).

* ``PROGRAM``: an error of the job itself, which a restart repeats: a Python error
  (exit 1), any exit code not listed in ``restarts.retry_exit_codes``, an exit 0 before the
  last step, JAX disagreeing with the plan or bad data (as the worker explained them,
  ``worker.contract.causes``), a join that never happens.
* ``INFRASTRUCTURE``: the machine, not the job: a death by a signal with no notice
  (SIGKILL, the kernel's OOM killer, SIGSEGV), a lost host or connection, a node failure,
  and the exit codes in ``restarts.retry_exit_codes`` (137: SIGKILL as a shell reports it).
* ``PREEMPTION``: a notice came first: SIGTERM from the system (exit 143 as a shell
  reports it), a Slurm job being preempted or requeued (``Preempted``).
* ``STALL``: the watchdog's verdict (alive, no progress).
* ``FINAL``: a restart would end the same way until someone acts: the scheduler's time
  limit, a full disk the worker explained (free space, then ``--resume``); never retried.
  Bad input never starts, so it has no class here (exit 2 before any attempt).

The cause: a process whose last lines say it stopped because *another* did (gloo's
"Connection closed by peer", the coordination service's "Socket closed" and its abort,
``launcher.console.explain.follows_from_another``) is a consequence. The attempt's class
is its first failure's, unless that failure is a consequence and another process that
failed by itself is not: a Python error in process 0 makes JAX's coordination client
abort process 1 (SIGABRT), and process 1's SIGKILL makes process 0 exit 1 with a gloo
error, in whichever order the ends arrive.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import resource  # loaded with the launcher: under EMFILE its import would fail
import signal

from launcher.console import explain
from launcher.ends import EndedEarly, Exit, Exited, Final, Killed, Lost, Preempted, Stalled
from launcher.state import Result, State, Tracked
from worker.contract.address import split_host_port
from worker.contract import causes, wire
from worker.contract import notice


class FailureClass(enum.Enum):
    PROGRAM = "program error"
    INFRASTRUCTURE = "infrastructure"
    PREEMPTION = "preemption"
    STALL = "stall"
    FINAL = "final"

    @property
    def counts_against_host(self) -> bool:
        """Whether a failure of this class counts against the host of the process it is read
        from (spares, quarantine, a Slurm node's exclusion): an infrastructure fault or a
        stall; a program error would repeat anywhere, a preemption is the system's."""
        return self in (FailureClass.INFRASTRUCTURE, FailureClass.STALL)

    @property
    def budget_key(self) -> str | None:
        """The ``restarts`` key that holds this class's budget (None: never retried)."""
        return _BUDGET_KEYS.get(self)


_BUDGET_KEYS = {FailureClass.PROGRAM: "program_errors",
                FailureClass.INFRASTRUCTURE: "infrastructure",
                FailureClass.PREEMPTION: "preemptions",
                FailureClass.STALL: "stalls"}

# Exit codes a shell (ssh's remote shell, srun) reports for a death by a signal: 128 + N
_SHELL_SIGTERM = 128 + signal.SIGTERM
_SHELL_SIGKILL = 128 + signal.SIGKILL


@dataclasses.dataclass(frozen=True)
class Verdict:
    """An attempt's failure: its class, the process it is read from, and why, in words.

    Attributes:
      failure_class: the cause's class.
      process_id: the process whose end gave the class.
      why: what happened, for the console, the summary and run.json.
    """

    failure_class: FailureClass
    process_id: int
    why: str

    @property
    def repeats(self) -> bool:
        """Whether a restart with the same settings repeats it (a program error: the job's own
        code, its data, its configuration, a loss that diverged): advice then names a fix to
        make first, never a retry of the same."""
        return self.failure_class is FailureClass.PROGRAM


def classify(result: Result, retry_exit_codes: tuple = ()) -> Verdict:
    """The class of a failed, not interrupted, attempt (see the module's docstring).

    Args:
      result: supervise's Result of the attempt.
      retry_exit_codes: ``restarts.retry_exit_codes``: exit codes counted as infrastructure.

    Returns:
      the Verdict of the cause.
    """
    first = result.first_failure
    if first is None or first.exit is None:
        return Verdict(FailureClass.PROGRAM, -1, "no process failed, yet not every process "
                       "succeeded")
    late = late_to_join(first, result.processes) if first.failed_to_join else []
    if late:
        return _waited_for(first, late[0])
    cause = first
    if follows_from_another(first) and not first.failed_to_join:  # no join: the cause is ours
        failed = [t for t in result.processes if t is not first and t.exit is not None
                  and t.state is State.FAILED and not follows_from_another(t)]
        # a peer whose end came after the teardown began (a host found silent only after
        # keepalive_timeout_s, a node Slurm marks down late) is STOPPED, yet the cause
        gone = [t for t in result.processes if t.state is State.STOPPED
                and isinstance(t.exit, Lost)]
        if failed or gone:
            cause = (failed or gone)[0]
        else:
            return Verdict(FailureClass.INFRASTRUCTURE, first.plan.process_id, (
                f"{classify_one(first, retry_exit_codes).why}, and its last lines say it stopped because another process did, none of which "
                "failed by itself in view: a peer that went away (a host, a connection)"))
    verdict = classify_one(cause, retry_exit_codes)
    if cause is not first:
        why = (f"{verdict.why}; process_id {first.plan.process_id} ({first.exit}) was reported "
               "first, but its last lines say it stopped because another process did")
        return dataclasses.replace(verdict, why=why)
    return verdict


def late_to_join(first: Tracked, processes: list) -> list:
    """The processes that ``first``, failed to join, waited for: those that never joined
    and began joining late: no JOINING line, or one that came after half of ``first``'s
    initialization_timeout_s had passed (a host slow to start at a restart); never-began
    first. Empty when every process began in time (then the coordinator's address, the
    network, is what to check)."""
    began_by = (None if first.joining_at is None or first.joining_timeout_s is None
                else first.joining_at + first.joining_timeout_s / 2)
    late = [t for t in processes if t is not first and not t.joined
            and (t.joining_at is None or began_by is not None and t.joining_at > began_by)]
    return sorted(late, key=lambda t: (t.joining_at is not None, t.joining_at or 0.0))


def _waited_for(first: Tracked, late: Tracked) -> Verdict:
    """The verdict of a join that failed waiting for a late process: the late one is named."""
    timeout = "" if first.joining_timeout_s is None else f" {first.joining_timeout_s:g} s"
    when = ("never began joining" if late.joining_at is None else
            f"began joining {late.joining_at - first.joining_at:.1f} s after it")
    return Verdict(FailureClass.PROGRAM, late.plan.process_id, (
        f"process_id {late.plan.process_id} on {late.plan.host} {when}, and process_id "
        f"{first.plan.process_id} on {first.plan.host} gave up waiting for it to join "
        f"({first.exit}) after distributed.initialization_timeout_s{timeout}: a late start, "
        f"not the network; raise distributed.initialization_timeout_s above the slowest "
        f"host's start, or find what delays process_id {late.plan.process_id} (its log)"))


def follows_from_another(t: Tracked) -> bool:
    """Whether ``t``'s end is a consequence of another process's (its last lines say so).
    Only an exit code or a signal can be: a backend's own verdict (``Lost``, ``Preempted``,
    ``Final``) and the watchdog's (``Stalled``) stand whatever the tail says."""
    return isinstance(t.exit, (Exited, Killed)) and explain.follows_from_another(t.tail)


def classify_one(t: Tracked, retry_exit_codes: tuple = ()) -> Verdict:
    """The class of one process's end, read from the end alone."""
    ended, pid = t.exit, t.plan.process_id
    where = f"process_id {pid} on {t.plan.host}"
    explained = causes.said(t.tail) if isinstance(ended, Exited) else None
    # an exhausted limit in its last lines (gloo's socket: Too many open files) is the cause,
    # not a join that failed because of it ("a configuration or network problem")
    if t.failed_to_join and explained is None and _ran_out(t.tail) is None:
        try:
            host = split_host_port(t.joining)
        except ValueError:
            host = (t.joining, "?")
        return Verdict(FailureClass.PROGRAM, pid, (
            f"{where} could not join the coordinator at {t.joining} ({ended}) within "
            "distributed.initialization_timeout_s: a configuration or network problem that a "
            f"restart does not fix; check that every host can reach {host[0]} on TCP port "
            f"{host[-1]} (firewalls, security groups), that host 0 started (its log), and that "
            "no proxy is forced on the workers (podlaunch adds the coordinator to no_proxy; a "
            "setup line that resets it undoes that)"))
    diverged = _nonfinite_loss(t.tail) if isinstance(ended, Exited) else None
    if explained is not None:  # the worker's own words decide (worker.contract.causes)
        failure_class, what = _explained(ended, *explained)
    elif diverged is not None:  # the worker's own words too: its loss stopped the run
        failure_class, what = FailureClass.PROGRAM, (
            f"exited with code {ended.code}, a loss that is no longer a number, which a restart "
            f"from the last checkpoint repeats: {diverged}; lower optimizer.learning_rate or "
            "look at the data of the steps before it")
    elif (ran_out := _ran_out(t.tail)) is not None and isinstance(ended, (Exited, Killed)):
        failure_class, what = FailureClass.FINAL, f"{_class_of(ended, ())[1].split(' (')[0]}, " \
            f"a limit of its host that ran out, which a restart finds run out again: {ran_out}"
    else:
        failure_class, what = _class_of(ended, retry_exit_codes)
    said = [line for line in t.tail if line.startswith(notice.PREFIX)]
    if failure_class is FailureClass.PREEMPTION and said:  # worker.recovery.notice: one agreed step
        what = f"{what}, after a {said[-1].removeprefix('preemption ')}"
    return Verdict(failure_class, pid, f"{where} {what}")


# Each cause a worker explains: its class and what it is, before the worker's own text
# (which says what to do). A full disk stays full on a restart: a final failure, which
# the user ends by freeing space and resuming, never a program error to retry.
_EXPLAINED = {
    causes.MISMATCH: (FailureClass.PROGRAM, "a configuration problem that a restart repeats"),
    causes.DATA: (FailureClass.PROGRAM, "bad data that a restart reads again"),
    causes.DISK_FULL: (FailureClass.FINAL, "a full disk that a restart finds full again"),
    causes.UNREACHABLE: (FailureClass.PROGRAM, "a network problem of its host that a restart "
                         "repeats"),
    causes.EXHAUSTED: (FailureClass.FINAL, "a limit of its host ran out, which a restart "
                       "finds run out again"),
}


_EMFILE_RE = re.compile(r"Too many open files|\[Errno 24\]|EMFILE")


def _ran_out(tail) -> str | None:
    """What a process's last lines say ran out of its host's open files (a library's own
    words: gloo's "accept: Too many open files", Python's ``[Errno 24]``), with this
    launcher's limit for scale (a local worker inherits it), or None."""
    if not any(_EMFILE_RE.search(line) for line in tail):
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    here = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    return (f"too many open files (EMFILE; the launching shell's ulimit -n is {here}): raise "
            "the limit (ulimit -n 65536) in the shell that launches or in cluster.setup, then "
            "launch again")


def _nonfinite_loss(tail) -> str | None:
    """The worker's words when a non-finite loss stopped it (``worker.telemetry.metrics``: a
    ``FloatingPointError`` in its ``failed at step N`` line), or None."""
    for line in reversed(list(tail)):
        if ": FloatingPointError: " in line and isinstance(wire.parse(line), wire.Failed):
            return line.split(": FloatingPointError: ", 1)[1].split(" (logging.", 1)[0]
    return None


def _explained(ended: Exited, cause: str, text: str) -> tuple:
    """(class, words) of an end the worker explained (``worker.contract.causes``)."""
    failure_class, kind = _EXPLAINED[cause]
    return failure_class, f"exited with code {ended.code}, {kind}: {text}"


def _class_of(ended: Exit, retry_exit_codes: tuple) -> tuple:
    """(class, what happened in words) of an end; ``where`` is put in front by Verdict."""
    match ended:
        case Final(why=why):
            return FailureClass.FINAL, f"ended: {why}"
        case Stalled(what=what):
            return FailureClass.STALL, f"stalled ({what})"
        case Preempted(why=why):
            return FailureClass.PREEMPTION, f"was preempted ({why})"
        case Lost(why=why):
            return FailureClass.INFRASTRUCTURE, f"was lost ({why})"
        case Killed(signal=signal.SIGTERM):
            return FailureClass.PREEMPTION, f"was {ended} (a notice: the system is stopping it)"
        case Killed():
            return FailureClass.INFRASTRUCTURE, f"was {ended} (no notice: the OOM killer, a " \
                "preemption without one, or a crash)"
        case EndedEarly(where=stopped):
            return FailureClass.PROGRAM, (f"exited with code 0 {stopped}: the task or the worker "
                                          "ended the process early (sys.exit(0)?), which a "
                                          "restart would repeat")
        case Exited(code=code) if code == _SHELL_SIGTERM:
            return FailureClass.PREEMPTION, f"exited with code {code} (SIGTERM as a shell reports it)"
        case Exited(code=code) if code == _SHELL_SIGKILL:
            return FailureClass.INFRASTRUCTURE, f"exited with code {code} (SIGKILL as a shell reports it)"
        case Exited(code=code) if code in retry_exit_codes:
            return FailureClass.INFRASTRUCTURE, (f"exited with code {code} (in "
                                                 "restarts.retry_exit_codes)")
        case Exited(code=1):
            return FailureClass.PROGRAM, "exited with code 1: a Python error in the job"
        case Exited(code=code):
            return FailureClass.PROGRAM, f"exited with code {code}"
    return FailureClass.PROGRAM, f"ended ({ended})"


class Budgets:
    """What each failure class may still use: ``restarts``' budgets, the ``max_restarts``
    cap, and the run of the same class that sets the wait."""

    def __init__(self, policy):
        self.policy = policy
        self.used = {c: 0 for c in FailureClass}
        self.total = 0
        self.last: FailureClass | None = None
        self.in_a_row = 0

    def restore(self, state: dict) -> None:
        """The counts a journal kept (``launcher.rundir.journal.Journal.state``)."""
        named = {c.value: c for c in FailureClass}
        for name, used in (state.get("used") or {}).items():
            if name in named and isinstance(used, int):
                self.used[named[name]] = used
        self.total = int(state.get("total") or 0)
        self.in_a_row = int(state.get("in_a_row") or 0)
        self.last = named.get(state.get("last"))

    def budget(self, failure_class: FailureClass) -> int:
        key = failure_class.budget_key
        return 0 if key is None else getattr(self.policy, key)

    def refusal(self, failure_class: FailureClass) -> str | None:
        """Why no restart is left for this class (None: one is)."""
        key = failure_class.budget_key
        if key is None:
            return "a restart would end the same way"
        budget, used = self.budget(failure_class), self.used[failure_class]
        if used >= budget:
            if budget == 0 and failure_class is FailureClass.PROGRAM:  # a retry repeats it
                return f"not retried: a restart repeats it (restarts.{key} is 0)"
            if budget == 0:
                return (f"not retried: restarts.{key} is 0 (set it to retry "
                        f"{failure_class.value}s)")
            return f"not retrying: restarts.{key} is {budget} and {used} used"
        cap = self.policy.max_restarts
        if cap is not None and self.total >= cap:
            return f"not retrying: restarts.max_restarts is {cap} and {self.total} used"
        return None

    def take(self, failure_class: FailureClass) -> float:
        """Count a restart of this class; the seconds to wait before it (``wait_s``)."""
        self.in_a_row = self.in_a_row + 1 if failure_class is self.last else 1
        self.last = failure_class
        self.used[failure_class] += 1
        self.total += 1
        return wait_s(self.policy.backoff_s, failure_class, self.in_a_row)

    def count_text(self, failure_class: FailureClass) -> str:
        """``infrastructure restart 1 of 10`` (and the cap's count when there is one)."""
        text = (f"{failure_class.value} restart {self.used[failure_class]} of "
                f"{self.budget(failure_class)}")
        if self.policy.max_restarts is not None:
            text += f"; restart {self.total} of {self.policy.max_restarts} in all"
        return text


def wait_s(backoff_s: float, failure_class: FailureClass, in_a_row: int) -> float:
    """Seconds before a restart: none for the first infrastructure fault or preemption of
    a run of them (the machines are back, or another is: waiting only loses time); else
    ``backoff_s`` doubling with each failure of the same class in a row."""
    if failure_class in (FailureClass.INFRASTRUCTURE, FailureClass.PREEMPTION):
        return 0.0 if in_a_row == 1 else backoff_s * 2 ** (in_a_row - 2)
    return backoff_s * 2 ** (in_a_row - 1)
