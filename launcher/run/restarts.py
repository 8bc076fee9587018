"""Bounded restarts: run attempts until one succeeds, a failure is not retried, or its budget is spent.

Each attempt is one ``session.start`` + ``supervise``. After a failure the
launcher has already torn everything down (``supervise`` returns only when
every worker has ended); it classifies the cause (``launcher.run.classes``:
program error, infrastructure, preemption, stall, final), checks that class's
budget (``restarts.program_errors``, ``infrastructure``, ``preemptions``, ``stalls``;
``max_restarts`` caps them together), waits (``wait_s``: none before the first
restart after an infrastructure fault or a preemption, ``backoff_s`` doubling as the
same class repeats), plans again through the backend's session (a fresh coordinator
port; ssh re-runs preflight) and starts every process with ``PODLAUNCH_RESUME=1``, so
process 0 restores the latest complete checkpoint and broadcasts it.

Logs: attempt 0 writes ``logs/process-NNN.log``; attempt n >= 1 writes
``logs/attempt-n/process-NNN.log`` (``plan.log_path``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import time
from typing import Callable

from launcher import plan as planning
from launcher.backends.base import Session
from launcher.console import Console
from launcher.errors import LaunchError
from launcher.run import classes, ledger
from launcher.run.classes import FailureClass, Verdict
from launcher.run.journal import Adopted
from launcher.state import Result, Watchdog
from launcher.console.status import compile_text, summary
from launcher.words import plural
from launcher import interrupts
from launcher.interrupts import Interrupted
from launcher.run.supervise import supervise


@dataclasses.dataclass
class Attempt:
    """One start of every process, and how it ended.

    Attributes:
      number: 0 for the first attempt of this run directory, n for the n-th restart.
      log_dir: where its per-process logs are.
      result: supervise's Result.
      verdict: what the launcher did next, in words ("succeeded", "retried after 2 s", ...).
      failure: the failure's class and cause (``classes.Verdict``), None when it did not fail.
      times: the launcher's clock at its stages, for the goodput ledger (``launcher.run.ledger``).
      host_changes: the hosts this attempt no longer used (``Session.host_changes``'s
        entries made while it was prepared: replaced by a spare, or dropped by a shrink).
    """

    number: int
    log_dir: str
    result: Result
    verdict: str = ""
    failure: Verdict | None = None
    times: ledger.Times | None = None
    host_changes: list = dataclasses.field(default_factory=list)


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
        """The counts a journal kept (``launcher.run.journal.Journal.state``)."""
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


def next_attempt(run_dir: str) -> int:
    """The first attempt number whose logs do not exist yet in ``run_dir`` (0 for a new run)."""
    logs = os.path.join(run_dir, "logs")
    if not os.path.isdir(logs):
        return 0
    numbers = [int(m.group(1)) for n in os.listdir(logs) if (m := re.match(r"^attempt-(\d+)$", n))]
    if numbers:
        return max(numbers) + 1
    return 1 if any(n.startswith("process-") for n in os.listdir(logs)) else 0


def run(session: Session, plan: planning.Plan, console: Console, first_attempt: int = 0,
        resume: bool = False, sleep: Callable[[float], None] = time.sleep,
        began_at: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        running: ledger.Running | None = None, journal=None,
        adopted: Adopted | None = None) -> tuple[Result, list]:
    """Run attempts of ``plan`` until success, a failure not retried, or its class's budget spent.

    Args:
      session: the backend's session (``start``, ``describe_start``, ``end_attempt``,
        and ``plan(restart=True)`` for each restart).
      plan: the prepared plan of the first attempt.
      console: where every attempt is announced.
      first_attempt: number of the first attempt (``next_attempt`` of the run directory).
      resume: whether the first attempt restores the latest checkpoint (``--resume``).
      sleep: waits the backoff (tests pass a recorder).
      began_at: when (``clock``) the launch began: the first attempt's ledger counts from
        there (default: now).
      clock: seconds, monotonic, for each attempt's ``ledger.Times``.
      running: kept up to date with the attempts (``ledger.Running``: the goodput so far that
        run.json shows while the run goes on).
      journal: a detached run's ``launcher.run.journal.Journal``, kept up to date.
      adopted: where a killed supervisor left the run (``launch attach``): its attempt's
        processes taken back, or the restart's wait it was in; ``first_attempt`` is that
        attempt's number.

    Returns:
      (the last attempt's Result, every Attempt in order; each failed one with its class).

    Raises:
      LaunchError: a backend could not start an attempt.
      KeyboardInterrupt: interrupted during an adopted restart's wait (nothing runs).
    """
    job = plan.job
    budgets = Budgets(job.restarts)
    watchdog = Watchdog(job.watchdog.stall_timeout_s, job.watchdog.first_step_timeout_s)
    attempts: list[Attempt] = []
    attempt, restarts, counted = first_attempt, 0, ""
    times = ledger.Times(clock() if began_at is None else began_at)
    # hosts the first attempt no longer uses (a --resume's spare, prepared before this call)
    changes = [dict(c, attempt=first_attempt) for c in session.host_changes]
    wait, why = None, ""  # wait set: go on with a restart's wait (an adopted one)
    then = None  # an adopted wait's next attempt's Times: it waits until their began_at
    if adopted is not None:
        budgets.restore(adopted.budgets)
        attempt, restarts, counted = adopted.attempt, adopted.restarts, adopted.counted
        times = adopted.times or times
        wait, then = adopted.wait_s, adopted.next_times
    while True:
        if wait is None:
            plan = planning.for_attempt(plan, attempt, resume=resume or restarts > 0)
            log_dir = os.path.dirname(plan.processes[0].log_path)
            os.makedirs(log_dir, exist_ok=True)
            label = f"attempt {attempt}" + (f" ({counted})" if restarts else "")
            taken = adopted is not None and adopted.workers is not None
            if taken:
                workers, pending = adopted.workers, None
                console.say(f"{label}: its {plural(len(workers), 'process')} taken back; logs in "
                            f"{log_dir}")
            else:
                console.say(f"{label}: {session.describe_start(plan)}; logs in {log_dir}")
                if journal is not None:
                    journal.state(attempt, budgets, restarts, counted, attempts)
                    journal.starting(times)
                workers, pending = _start(session, plan, console)
                times.started_at = clock()
            adopted = None
            if running is not None:
                running.attempts, running.current = attempts, (attempt, times)
            if journal is not None:
                journal.state(attempt, budgets, restarts, counted, attempts)
                journal.attempt_started(times, workers)
            result = supervise(workers, job.cluster.grace_s, console, watchdog=watchdog,
                               interrupted_by=pending,
                               notice_grace_s=job.checkpoint.notice_grace_s,
                               journal=journal, adopted=taken)
            times.ended_at = clock()
            console.attempt_over(result)
            attempts.append(Attempt(attempt, log_dir, result, times=times, host_changes=changes))
            if running is not None:
                running.current = None  # among the attempts now
            if result.exit_code == 0:
                attempts[-1].verdict = "succeeded"
                return result, attempts
            if result.interrupted:
                attempts[-1].verdict = "interrupted"
                return result, attempts
            failure = classes.classify(result, job.restarts.retry_exit_codes)
            attempts[-1].failure = failure
            why = f"{failure.why} [{failure.failure_class.value}]"
            refusal = budgets.refusal(failure.failure_class)
            if refusal is not None:
                attempts[-1].verdict = f"failed: {why}; {refusal}"
                console.say(f"{label} failed: {why}; {refusal}")
                return result, attempts
            console.block(summary(result))  # the last attempt's is printed by the caller
            restarts += 1
            wait = budgets.take(failure.failure_class)
            counted = budgets.count_text(failure.failure_class)
            attempts[-1].verdict = f"failed: {why}; retried after {wait:g} s"
            console.say(f"{label} failed: {why}; restarting from the latest checkpoint in "
                        f"{wait:g} s ({counted})")
            session.failed(plan, failure, result)
            session.end_attempt()
            if journal is not None:
                journal.state(attempt, budgets, restarts, counted, attempts)
                journal.waiting(times.ended_at, wait)
        elif wait > 0:
            console.say(f"attempt {attempt + 1} of the run starts in {wait:.1f} s (the restart's "
                        "wait the killed supervisor was in)")
        try:
            # an adopted wait ends when the ledger's count of it does (this launch's start-up
            # since is within it, not after it)
            _wait(sleep, wait if then is None else max(0.0, then.began_at - clock()))
        except (KeyboardInterrupt, Interrupted) as exc:
            if not attempts:  # an adopted wait: no attempt of this launch, nothing runs
                raise KeyboardInterrupt(str(exc)) from None
            result.interrupted = True
            attempts[-1].verdict += "; interrupted while waiting"
            times.waited_s = clock() - times.ended_at
            return result, attempts
        now = clock()  # the wait ends, and the next attempt begins, at the same moment
        if attempts:
            times.waited_s = now - times.ended_at
        times, wait, then = then or ledger.Times(now), None, None
        known = len(session.host_changes)
        try:
            plan = session.plan(restart=True)
        except LaunchError as exc:
            # the restart could not be prepared (a host not back, a job that cannot be
            # submitted again): the attempts so far, each failure classified, go with it
            if attempts:
                attempts[-1].verdict = f"failed: {why}; its restart was refused"
            exc.attempts = attempts
            raise
        changes = [dict(c, attempt=attempt + 1) for c in session.host_changes[known:]]
        attempt += 1


def _start(session: Session, plan: planning.Plan, console: Console) -> tuple[list, str | None]:
    """``session.start(plan)`` with the first interrupt (Ctrl-C, SIGTERM, SIGHUP) held back.

    A start interrupted halfway would leave the processes it had started unknown to
    anyone; so the first signal is remembered and ``supervise`` tears every started
    process down at once. A second one interrupts the start itself (each backend's
    ``start`` stops what it started when it raises).

    Returns:
      (the workers, the name of the signal held back or None).
    """
    pending: list = []

    def hold(signum, frame):
        if pending:
            raise KeyboardInterrupt(signal.Signals(signum).name)
        pending.append(signal.Signals(signum).name)
        console.say(f"interrupted ({pending[0]}) while starting; stopping every process as soon "
                    "as they have started (again to abandon the start)")

    with interrupts.handled(hold):
        workers = session.start(plan)
    return workers, (pending[0] if pending else None)


def _wait(sleep: Callable[[float], None], wait_s: float) -> None:
    """Sleep, turning SIGTERM and SIGHUP into ``Interrupted`` meanwhile (supervise does it
    while running)."""
    with interrupts.handled(interrupts.raise_interrupted):
        sleep(wait_s)


def attempts_table(attempts: list) -> str:
    """One line per attempt for the final summary (only worth printing after a restart)."""
    earlier = attempts[0].number if attempts else 0  # a resumed run's attempts before this launch
    lines = [f"attempts: {len(attempts)} ({plural(len(attempts) - 1, 'restart')})"
             + (f" in this launch; {plural(earlier + len(attempts), 'attempt')} in the run"
                if earlier else "")]
    for a in attempts:
        first = a.result.first_failure
        step = max((t.last_step for t in a.result.processes if t.last_step is not None), default=None)
        reached = "-" if step is None else str(step)
        lines.append(f"  attempt {a.number:<3} last step {reached:<8} {a.log_dir}")
        for change in a.host_changes:
            lines.append(f"      before it: {change['text']}")
        lines.append(f"      {a.verdict if first is not None or a.verdict else 'succeeded'}")
        compiled = compile_text(a.result.processes)
        if compiled is not None:
            lines.append(f"      {compiled}")
    return "\n".join(lines)
