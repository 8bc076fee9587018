"""Bounded restarts: run attempts until one succeeds, a failure is not retryable, or none are left.

Each attempt is one ``session.start`` + ``supervise``. After a failure the
launcher has already torn everything down (``supervise`` returns only when
every worker has ended); it classifies the root cause, waits
``backoff_s * 2**(restart-1)`` seconds, plans again through the backend's
session (a fresh coordinator port; ssh re-runs preflight) and starts every process with
``PODLAUNCH_RESUME=1``, so process 0 restores the latest complete checkpoint
and broadcasts it.

What is retried (``classify``): a death by a signal (preemption, OOM killer,
SIGKILL), a lost host, a stall, and the exit codes in
``restarts.retry_exit_codes``. Exit code 1 (a Python error in the task) and 3
(the worker's plan check) are not, unless listed.

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
from launcher.state import (EndedEarly, Exited, Final, Killed, Lost, Result, Stalled, State,
                            Tracked, Watchdog)
from launcher.console.status import compile_text, summary
from launcher.console.words import plural
from launcher import interrupts
from launcher.interrupts import Interrupted
from launcher.run.supervise import supervise
from worker import contract


@dataclasses.dataclass
class Attempt:
    """One start of every process, and how it ended.

    Attributes:
      number: 0 for the first attempt of this run directory, n for the n-th restart.
      log_dir: where its per-process logs are.
      result: supervise's Result.
      verdict: what the launcher did next, in words ("succeeded", "retried after 2 s", ...).
    """

    number: int
    log_dir: str
    result: Result
    verdict: str = ""


def classify(result: Result, policy) -> tuple[bool, str]:
    """Whether a failed attempt may be retried, and why, in words.

    The first failure by time leads, but a cascade can outrun its cause (a
    peer's "connection reset" exit 1 reported before the SIGKILLed worker's
    exit arrives over ssh), so the attempt is retryable when any process that
    ended by itself (state FAILED, not stopped by the launcher) ended in a
    retryable way.

    Args:
      result: a failed, not interrupted, attempt.
      policy: the spec's ``restarts`` section.

    Returns:
      (retryable, reason).
    """
    first = result.first_failure
    if first is None:
        return False, "no process failed, yet not every process succeeded"
    verdict = _classify_one(first, policy)
    if not verdict[0]:
        for t in result.processes:
            if t is not first and t.state is State.FAILED and t.exit is not None:
                retry, why = _classify_one(t, policy)
                if retry:
                    return True, f"{why}, while process_id {first.plan.process_id} ({first.exit}) was reported first"
    return verdict


def _classify_one(t: Tracked, policy) -> tuple[bool, str]:
    ended, where = t.exit, f"process_id {t.plan.process_id} on {t.plan.host}"
    if t.failed_to_join:
        try:
            host = contract.split_host_port(t.joining)
        except ValueError:
            host = (t.joining, "?")
        return False, (f"{where} could not join the coordinator at {t.joining} ({ended}) within "
                       "distributed.initialization_timeout_s: a configuration or network problem "
                       f"that a restart does not fix; check that every host can reach {host[0]} "
                       f"on TCP port {host[-1]} (firewalls, security groups), that host 0 "
                       "started (its log), and that no proxy is forced on the workers (podlaunch "
                       "adds the coordinator to no_proxy; a setup line that resets it undoes that)")
    codes = ", ".join(map(str, policy.retry_exit_codes)) or "none"
    match ended:
        case EndedEarly(where=stopped):
            return False, (f"{where} exited with code 0 {stopped}: the task or the worker ended "
                           "the process early (sys.exit(0)?), which a restart would repeat")
        case Final(why=why):
            return False, f"{where} ended: {why}; a restart would end the same way"
        case Stalled(what=what):
            return True, f"{where} stalled ({what})"
        case Lost(why=why):
            return True, f"{where} was lost ({why})"
        case Killed():
            return True, f"{where} was {ended} (a preemption or a signal)"
        case Exited(code=code) if code in policy.retry_exit_codes:
            return True, f"{where} exited with code {code} (in restarts.retry_exit_codes)"
        case Exited(code=1):
            return False, (f"{where} exited with code 1: a Python error in the job, not retried "
                           f"(restarts.retry_exit_codes: {codes}; add 1 to retry it)")
        case Exited(code=contract.EXIT_MISMATCH):
            return False, (f"{where} exited with code {contract.EXIT_MISMATCH}: JAX disagrees "
                           "with the plan, a configuration problem that a restart cannot fix")
        case Exited(code=code):
            return False, (f"{where} exited with code {code}, not in restarts.retry_exit_codes "
                           f"({codes})")
    return False, f"{where} ended ({ended})"


def backoff_s(policy, restart: int) -> float:
    """Seconds to wait before restart number ``restart`` (1, 2, ...): doubling from ``backoff_s``."""
    return policy.backoff_s * 2 ** (restart - 1)


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
        resume: bool = False, sleep: Callable[[float], None] = time.sleep) -> tuple[Result, list]:
    """Run attempts of ``plan`` until success, a non-retryable failure, or no restarts left.

    Args:
      session: the backend's session (``start``, ``describe_start``, ``end_attempt``,
        and ``plan(restart=True)`` for each restart).
      plan: the prepared plan of the first attempt.
      console: where every attempt is announced.
      first_attempt: number of the first attempt (``next_attempt`` of the run directory).
      resume: whether the first attempt restores the latest checkpoint (``--resume``).
      sleep: waits the backoff (tests pass a recorder).

    Returns:
      (the last attempt's Result, every Attempt in order).

    Raises:
      LaunchError: a backend could not start an attempt.
    """
    job = plan.job
    policy = job.restarts
    watchdog = Watchdog(job.watchdog.stall_timeout_s, job.watchdog.first_step_timeout_s)
    attempts: list[Attempt] = []
    attempt, restarts = first_attempt, 0
    while True:
        plan = planning.for_attempt(plan, attempt, resume=resume or restarts > 0)
        log_dir = os.path.dirname(plan.processes[0].log_path)
        os.makedirs(log_dir, exist_ok=True)
        label = f"attempt {attempt}" + (f" (restart {restarts} of {policy.max_restarts})" if restarts else "")
        console.say(f"{label}: {session.describe_start(plan)}; logs in {log_dir}")
        workers, pending = _start(session, plan, console)
        result = supervise(workers, job.cluster.grace_s, console, watchdog=watchdog,
                           interrupted_by=pending)
        console.attempt_over(result)
        attempts.append(Attempt(attempt, log_dir, result))
        if result.exit_code == 0:
            attempts[-1].verdict = "succeeded"
            return result, attempts
        if result.interrupted:
            attempts[-1].verdict = "interrupted"
            return result, attempts
        retryable, why = classify(result, policy)
        if not retryable:
            attempts[-1].verdict = f"failed: {why}"
            console.say(f"{label} failed: {why}")
            return result, attempts
        if restarts >= policy.max_restarts:
            attempts[-1].verdict = f"failed: {why}; no restarts left"
            console.say(f"{label} failed: {why}; not retrying: restarts.max_restarts is "
                        f"{policy.max_restarts} and {restarts} used")
            return result, attempts
        console.block(summary(result))  # the last attempt's is printed by the caller
        restarts += 1
        wait_s = backoff_s(policy, restarts)
        attempts[-1].verdict = f"failed: {why}; retried after {wait_s:g} s"
        console.say(f"{label} failed: {why}; restarting from the latest checkpoint in {wait_s:g} s "
                    f"(restart {restarts} of {policy.max_restarts})")
        session.end_attempt()
        try:
            _wait(sleep, wait_s)
        except (KeyboardInterrupt, Interrupted):
            result.interrupted = True
            attempts[-1].verdict += "; interrupted while waiting"
            return result, attempts
        plan = session.plan(restart=True)
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
    lines = [f"attempts: {len(attempts)} ({plural(len(attempts) - 1, 'restart')})"]
    for a in attempts:
        first = a.result.first_failure
        step = max((t.last_step for t in a.result.processes if t.last_step is not None), default=None)
        reached = "-" if step is None else str(step)
        lines.append(f"  attempt {a.number:<3} last step {reached:<8} {a.log_dir}")
        lines.append(f"      {a.verdict if first is not None or a.verdict else 'succeeded'}")
        compiled = compile_text(a.result.processes)
        if compiled is not None:
            lines.append(f"      {compiled}")
    return "\n".join(lines)
