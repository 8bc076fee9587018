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
from launcher.run import classes
from launcher.run.classes import Budgets
from launcher.rundir import ledger
from launcher.run.classes import Verdict
from launcher.rundir.journal import Adopted
from launcher.rundir.watcher import RunWatcher, Watchers
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
      times: the launcher's clock at its stages, for the goodput ledger (``launcher.rundir.ledger``).
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


def next_attempt(run_dir: str) -> int:
    """The first attempt number whose logs do not exist yet in ``run_dir`` (0 for a new run)."""
    logs = os.path.join(run_dir, "logs")
    if not os.path.isdir(logs):
        return 0
    numbers = [int(m.group(1)) for n in os.listdir(logs) if (m := re.match(r"^attempt-(\d+)$", n))]
    if numbers:
        return max(numbers) + 1
    return 1 if any(n.startswith("process-") for n in os.listdir(logs)) else 0


@dataclasses.dataclass
class Begin:
    """Where the restart loop begins, and the time it keeps.

    Attributes:
      first_attempt: number of the first attempt (``next_attempt`` of the run directory).
      resume: whether the first attempt restores the latest checkpoint (``--resume``).
      began_at: when (``clock``) the launch began: the first attempt's ledger counts from
        there (None: now).
      adopted: where a killed supervisor left the run (``launch attach``): its attempt's
        processes taken back, or the restart's wait it was in; ``first_attempt`` is that
        attempt's number.
      clock: seconds, monotonic, for each attempt's ``ledger.Times``.
      sleep: waits the backoff (tests pass a recorder).
    """

    first_attempt: int = 0
    resume: bool = False
    began_at: float | None = None
    adopted: Adopted | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def run(session: Session, plan: planning.Plan, console: Console, begin: Begin | None = None,
        watchers: RunWatcher | None = None) -> tuple[Result, list]:
    """Run attempts of ``plan`` until success, a failure not retried, or its class's budget spent.

    Args:
      session: the backend's session (``start``, ``describe_start``, ``end_attempt``,
        and ``plan(restart=True)`` for each restart).
      plan: the prepared plan of the first attempt.
      console: where every attempt is announced.
      begin: the first attempt, whether it resumes, a take-back's state, the clock (default:
        attempt 0, fresh, real time).
      watchers: the run-level watchers (``launcher.rundir.watcher``: run.json's goodput so
        far, a detached run's journal), told of each attempt's start and end in order, and
        supervision's polls.

    Returns:
      (the last attempt's Result, every Attempt in order; each failed one with its class).

    Raises:
      LaunchError: a backend could not start an attempt.
      KeyboardInterrupt: interrupted during an adopted restart's wait (nothing runs).
    """
    begin = begin or Begin()
    loop = _Attempts(session, plan, console, begin, watchers or Watchers())
    adopted = begin.adopted
    wait, then = None, None  # wait set: go on with a restart's wait (an adopted one)
    if adopted is not None:
        wait, then = loop.restore(adopted)
    while True:
        if wait is None:
            wait = loop.attempt(adopted)
            adopted = None
            if wait is None:  # it succeeded, was interrupted, or is not retried
                return loop.result, loop.attempts
        elif wait > 0:
            console.say(f"attempt {loop.number + 1} of the run starts in {wait:.1f} s (the "
                        "restart's wait the killed supervisor was in)")
        if not loop.wait(begin.sleep, wait, then):
            return loop.result, loop.attempts
        loop.plan_next()
        wait, then = None, None


class _Attempts:
    """``run``'s state between its attempts: the budgets, the attempts so far, the ledger's
    times of the one under way or waited for; ``attempt`` runs one, ``wait`` waits a
    restart's backoff, ``plan_next`` plans the next."""

    def __init__(self, session: Session, plan: planning.Plan, console: Console, begin: Begin,
                 watchers: RunWatcher):
        self.session, self.plan, self.console, self.job = session, plan, console, plan.job
        self.resume, self.clock, self.watchers = begin.resume, begin.clock, watchers
        first_attempt, began_at, clock = begin.first_attempt, begin.began_at, begin.clock
        self.budgets = Budgets(self.job.restarts)
        self.watchdog = Watchdog(self.job.watchdog.stall_timeout_s,
                                 self.job.watchdog.first_step_timeout_s)
        self.attempts: list[Attempt] = []
        self.number, self.restarts, self.counted = first_attempt, 0, ""
        self.times = ledger.Times(clock() if began_at is None else began_at)
        # hosts the first attempt no longer uses (a --resume's spare, prepared before this call)
        self.changes = [dict(c, attempt=first_attempt) for c in session.host_changes]
        self.result: Result | None = None
        self.why = ""
        self.then = None  # an adopted wait's next attempt's Times: it waits until their began_at

    def restore(self, adopted: Adopted) -> tuple:
        """Go on from where a killed supervisor left the run; returns ``(wait_s, next_times)``
        of the restart's wait it was in (None, None: its attempt's processes are taken back)."""
        self.budgets.restore(adopted.budgets)
        self.number, self.restarts, self.counted = adopted.attempt, adopted.restarts, adopted.counted
        self.times = adopted.times or self.times
        return adopted.wait_s, adopted.next_times

    def attempt(self, adopted: Adopted | None) -> float | None:
        """Start (or take back) attempt ``number``, supervise it to its end and record it.

        Returns:
          The restart's wait in seconds, or None when the run is over (succeeded, interrupted,
          or a failure its budget does not retry): ``result`` and ``attempts`` say which.
        """
        session, console, watchers, clock = self.session, self.console, self.watchers, self.clock
        times = self.times
        plan = self.plan = planning.for_attempt(self.plan, self.number,
                                                resume=self.resume or self.restarts > 0)
        log_dir = os.path.dirname(plan.processes[0].log_path)
        os.makedirs(log_dir, exist_ok=True)
        label = f"attempt {self.number}" + (f" ({self.counted})" if self.restarts else "")
        taken = adopted is not None and adopted.workers is not None
        if taken:
            workers, pending = adopted.workers, None
            console.say(f"{label}: its {plural(len(workers), 'process')} taken back; logs in "
                        f"{log_dir}")
        else:
            console.say(f"{label}: {session.describe_start(plan)}; logs in {log_dir}")
            watchers.attempt_starting(self, times)
            workers, pending = _start(session, plan, console)
            times.started_at = clock()
        watchers.attempt_started(self, times, workers)
        job = self.job
        result = self.result = supervise(workers, job.cluster.grace_s, console,
                                         watchdog=self.watchdog, interrupted_by=pending,
                                         notice_grace_s=job.checkpoint.notice_grace_s,
                                         watchers=watchers, adopted=taken)
        times.ended_at = clock()
        console.attempt_over(result)
        self.attempts.append(Attempt(self.number, log_dir, result, times=times,
                                     host_changes=self.changes))
        wait = self._verdict(self.attempts[-1], label)
        watchers.attempt_ended(self, self.attempts[-1], wait)
        return wait

    def _verdict(self, last: Attempt, label: str) -> float | None:
        """The ended attempt's verdict (said, and kept on it): the restart's wait, or None
        when the run is over."""
        session, console, job, result = self.session, self.console, self.job, self.result
        plan = self.plan
        if result.exit_code == 0:
            last.verdict = "succeeded"
            return None
        if result.interrupted:
            last.verdict = "interrupted"
            return None
        failure = classes.classify(result, job.restarts.retry_exit_codes)
        last.failure = failure
        why = self.why = f"{failure.why} [{failure.failure_class.value}]"
        refusal = self.budgets.refusal(failure.failure_class)
        if refusal is not None:
            last.verdict = f"failed: {why}; {refusal}"
            console.say(f"{label} failed: {why}; {refusal}")
            return None
        # the last attempt's is printed by the caller; this one's is said to be the attempt's
        # (it read as the run's end, its FAILED line and table, with the run going on)
        console.say(f"{label} is over, not the run: a restart follows; what {label} reached:")
        console.block(summary(result))
        self.restarts += 1
        wait = self.budgets.take(failure.failure_class)
        self.counted = self.budgets.count_text(failure.failure_class)
        last.verdict = f"failed: {why}; retried after {wait:g} s"
        console.say(f"{label} failed: {why}; restarting from the latest checkpoint in "
                    f"{wait:g} s ({self.counted})")
        session.failed(plan, failure, result)
        session.end_attempt()
        return wait

    def wait(self, sleep: Callable[[float], None], wait_s: float, then) -> bool:
        """Wait a restart's ``wait_s`` (an adopted wait: until ``then``'s began_at, when the
        ledger's count of it ends: this launch's start-up since is within it, not after it).

        Returns:
          True when the next attempt is to start; False when interrupted meanwhile (the
          last attempt's result says so).

        Raises:
          KeyboardInterrupt: interrupted in an adopted wait (no attempt of this launch,
            nothing runs).
        """
        clock, times = self.clock, self.times
        try:
            _wait(sleep, wait_s if then is None else max(0.0, then.began_at - clock()))
        except (KeyboardInterrupt, Interrupted) as exc:
            if not self.attempts:
                raise KeyboardInterrupt(str(exc)) from None
            self.result.interrupted = True
            self.attempts[-1].verdict += "; interrupted while waiting"
            times.waited_s = clock() - times.ended_at
            return False
        now = clock()  # the wait ends, and the next attempt begins, at the same moment
        if self.attempts:
            times.waited_s = now - times.ended_at
        self.times = then or ledger.Times(now)
        return True

    def plan_next(self) -> None:
        """Plan the next attempt through the backend's session (``plan(restart=True)``).

        Raises:
          LaunchError: the restart could not be prepared (a host not back, a job that cannot
            be submitted again), with ``attempts``: every attempt so far, each failure
            classified.
        """
        known = len(self.session.host_changes)
        try:
            self.plan = self.session.plan(restart=True)
        except LaunchError as exc:
            if self.attempts:
                self.attempts[-1].verdict = f"failed: {self.why}; its restart was refused"
            exc.attempts = self.attempts
            raise
        self.changes = [dict(c, attempt=self.number + 1)
                        for c in self.session.host_changes[known:]]
        self.number += 1


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
