"""Watch every worker, stream its lines, fail fast, and tear everything down.

Backend-neutral: a backend hands over one ``Worker`` per process (a local
subprocess, a remote command over SSH, ...) and ``supervise`` does the rest:

* a reader thread per worker writes each line to ``logs/process-NNN.log``
  first (so nothing is lost) and queues it for the console with a ``[pN]`` prefix
  (lines two threads of a worker glued together are split back first:
  ``launcher.console.lines``; ``launcher.run.output``);
* the main thread polls every worker (with many processes, a process whose output
  ended at every poll and all of them less often: ``SWEEP_PROCESSES``); the first one
  that exits non-zero, dies by a signal, or is lost, is the root cause. Every other worker then gets
  TERM to its process group, ``grace_s`` to exit, then KILL;
* Ctrl-C, SIGTERM or SIGHUP (the terminal closed) to the launcher stops
  everything the same way (``interrupt_signals``; a SIGHUP that ``nohup``
  set to be ignored stays ignored);
* the stall watchdog: a worker alive but without step progress (progress,
  heartbeat or failure lines) for ``stall_timeout_s`` (``first_step_timeout_s``
  before its first step) is a failure. The launcher reports the last step of
  every process and SIGKILLs them all at once: a stuck or stopped process
  cannot act on SIGTERM, and SIGKILL also ends a stopped one.

The failure report leads with the first failure by time, not the cascade it
caused (as torch.distributed.elastic does).

Time is injected: ``clock`` (default ``time.monotonic``) is read for every
timestamp and deadline, and ``sleep`` (default ``time.sleep``; the lines that came
meanwhile are shown after it) is how the loop lets time pass, so ``tests/run/test_supervise.py`` drives a whole
run, stall or teardown with fake workers and a fake clock in milliseconds.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Callable, Iterable

from launcher import interrupts, proctl
from launcher.interrupts import Interrupted
from launcher.run import blame, profiles, stacks
from launcher.rundir import journal as journals
from launcher.run.output import Output, pump
from launcher.run.pauses import Pauses
from launcher.console import Console
from launcher.state import Result, Tracked, Watchdog, Worker
from launcher.words import plural
from worker.contract import notice

KILL_WAIT_S = 10.0  # after SIGKILL, how long to wait for every worker to be reaped
# Up to this many processes every poll walks them all (exits, stalls, what was asked); above
# it the walk comes less often, at most every MAX_SWEEP_S, so that its cost per second stays
# that of SWEEP_PROCESSES processes (a process whose output ended is still polled at once)
SWEEP_PROCESSES = 64
MAX_SWEEP_S = 1.0


def supervise(workers: Iterable[Worker], grace_s: float, console: Console,
              poll_interval_s: float = 0.05, watchdog: Watchdog | None = None,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] | None = None,
              interrupted_by: str | None = None, notice_grace_s: float = 0.0,
              watchers=None, adopted: bool = False) -> Result:
    """Run until every worker succeeded, one failed, or the launcher is interrupted.

    Args:
      workers: started workers, in process_id order.
      grace_s: seconds between SIGTERM and SIGKILL during teardown.
      console: where prefixed lines and launcher messages go.
      poll_interval_s: how often exits are checked.
      watchdog: stall timeouts; None: no watchdog.
      clock: seconds, monotonic; every timestamp and deadline reads it.
      sleep: lets time pass between polls; None (the default) waits on the
        workers' output instead, showing a line as soon as it arrives.
      interrupted_by: a signal that came while the workers were starting (its
        name): tear them down at once.
      notice_grace_s: how long the teardown waits, in all, for a process that said it
        stops after an agreed step and saves it (``worker.recovery.notice``; the launcher's own
        SIGTERM is such a notice), where ``grace_s`` would cut its save short.
      watchers: the run-level watchers (``launcher.rundir.watcher``), told before and after
        every poll's flush of the logs (a detached run's journal keeps how far each process's
        output is in its log); None: none.
      adopted: the workers were taken back from a killed supervisor: what their lines said
        before is read again from their logs (``journal.replay``).

    Returns:
      A Result; every worker has ended (or been killed) by the time it returns.
    """
    started = clock()
    output = Output(console, sleep)
    tracked = [Tracked(w) for w in workers]
    if adopted:
        for t in tracked:
            journals.replay(t, clock)
    logs: list = []  # each reader's LogFile, flushed every poll
    for t in tracked:
        t.reader = threading.Thread(target=pump, args=(t, output, clock, logs), daemon=True,
                                    name=f"reader-{t.plan.process_id}")
        t.reader.start()

    # real time only: a test's fake clock (``sleep``) has no pauses to find
    pauses = Pauses(clock) if sleep is None and watchdog is not None else None
    previous = interrupts.install(interrupts.raise_interrupted)
    first_failure: Tracked | None = None
    interrupted, answers = False, profiles.Answers(tracked, console, clock)
    read: list = []  # the stacks' summary lines, when they were read before the teardown
    try:
        try:
            if interrupted_by is not None:
                raise Interrupted(interrupted_by)
            next_check = next_sweep = clock() + poll_interval_s
            # every poll: the lines, the log flushes, the status line, and the exit of a
            # process whose output just ended; the walks over every process (exits, stalls,
            # what was asked) every poll up to SWEEP_PROCESSES processes, and less often
            # above, at most every MAX_SWEEP_S (bench/bench_supervise_scale.py: 1,024)
            sweep_every_s = min(MAX_SWEEP_S,
                                poll_interval_s * max(1.0, len(tracked) / SWEEP_PROCESSES))
            while True:
                output.wait(max(0.0, next_check - clock()))
                if clock() < next_check:
                    continue
                next_check = clock() + poll_interval_s
                sweep = clock() >= next_sweep
                if sweep:
                    next_sweep = clock() + sweep_every_s
                if watchers is not None:
                    watchers.before_flush()
                for log in logs:
                    log.flush_pending()
                if watchers is not None:
                    watchers.after_flush(logs)
                console.status(tracked)
                if sweep:
                    answers.poll(output.wait)  # launch stacks / launch profile; profiles traced
                watched = tracked if sweep else output.ended()
                for t in watched:
                    if t.running and t.poll(clock) and not t.exit.ok and first_failure is None:
                        first_failure = t
                if first_failure is None and watchdog is not None and sweep:
                    first_failure = blame.stalled(tracked, watchdog, started, console, clock, pauses)
                if first_failure is not None and first_failure.stall is not None:
                    # what every process was doing, before the SIGKILL ends it
                    read = stacks.read_before(tracked, output.wait, console, clock, "stalled",
                                              focus=first_failure.plan.process_id)
                    break
                if first_failure is not None:
                    first_failure = blame.root_cause(tracked, output, clock)
                    frozen = blame.frozen(tracked, first_failure)
                    if frozen is not None:  # the cause, though its peer ended first
                        console.say(f"{frozen.plan.label} {frozen.stall}; "
                                    f"{first_failure.plan.label} ended ({first_failure.exit}) "
                                    "because of it; killing every process")
                        first_failure = frozen
                        break
                    running = sum(t.running for t in tracked)
                    console.say(f"{first_failure.plan.label} failed ({first_failure.exit})"
                                + (f"; stopping the other {plural(running, 'process')}"
                                   if running else ""))
                    break
                if watched and not any(t.running for t in tracked):
                    break
        except (KeyboardInterrupt, Interrupted) as exc:
            interrupted = True
            console.interrupted({"": "Ctrl-C", "SIGINT": "Ctrl-C"}.get(str(exc), str(exc)))
            hung = stacks.looks_hung(tracked, started, clock)
            if hung is not None:
                console.say(f"interrupted ({str(exc) or 'SIGINT'}); the run looks hung ({hung})")
                try:
                    read = stacks.read_before(tracked, output.wait, console, clock, "interrupted")
                except (KeyboardInterrupt, Interrupted):
                    pass  # a second interrupt: stop at once
            console.say(f"interrupted ({str(exc) or 'SIGINT'}); stopping all processes")
        stalled = first_failure is not None and first_failure.stall is not None
        # the launcher's SIGTERM is a notice to every worker: a run not hung may save
        _teardown(tracked, grace_s, output, console, clock, kill_now=stalled,
                  notice_grace_s=notice_grace_s,
                  notice_wait=interrupted and stacks.looks_hung(tracked, started, clock) is None)
    finally:
        interrupts.restore(previous)
        if pauses is not None:
            pauses.close()
    for t in tracked:
        t.reader.join(timeout=2.0)
    output.wait(0)
    answers.finish()  # a profile asked of this attempt: said with the traces that came
    console.end_status()
    return Result(tracked, first_failure, interrupted, clock() - started, stacks=read)


def _teardown(tracked: list, grace_s: float, output: Output, console: Console,
              clock: Callable[[], float], kill_now: bool = False,
              notice_grace_s: float = 0.0, notice_wait: bool = False) -> None:
    """Stop every running worker: TERM, up to grace_s, then KILL (``proctl.stop``); a
    process saving an agreed notice's step gets up to notice_grace_s before the KILL.

    Args:
      kill_now: SIGKILL at once, no TERM (after a stall: a stuck or stopped process
        cannot act on SIGTERM).
      notice_wait: the launcher was interrupted, so every process may be saving: wait for all.
    """
    running = [t for t in tracked if t.running]
    if not running:
        return

    def alive() -> bool:
        for t in running:
            if t.running:
                t.poll(clock)
        return any(t.running for t in running)

    def send(signals: tuple) -> None:
        if signal.SIGKILL not in signals:
            for t in running:
                if t.running:
                    t.worker.terminate()  # TERM and CONT, to the worker's process group
            return
        still = [t for t in running if t.running]
        if not kill_now:
            console.say(f"sending SIGKILL to {', '.join(t.plan.label for t in still)} "
                        f"(still running {grace_s:g}s after SIGTERM)")
        for t in still:
            t.worker.kill()

    def saved() -> bool:
        """Whether the processes saving an agreed step ended within notice_grace_s."""
        said = [t for t in running if t.running and (notice_wait or any(
            notice.AGREED_RE.match(line) for line in list(t.tail)[-4:]))]
        if not said or notice_grace_s <= grace_s:
            return False
        console.say(f"waiting up to {notice_grace_s - grace_s:g} s more for "
                    f"{', '.join(t.plan.label for t in said)}: saving the step every process "
                    "agreed on (checkpoint.notice_grace_s)")
        return bool(proctl.wait_until(lambda: not alive(), notice_grace_s - grace_s,
                                      clock=clock, sleep=output.wait))

    wait = dict(clock=clock, sleep=output.wait)
    try:
        if kill_now:
            proctl.kill_and_wait(send, alive, KILL_WAIT_S, **wait)
        else:
            send((signal.SIGTERM, signal.SIGCONT))
            if not proctl.wait_until(lambda: not alive(), grace_s, **wait) and not saved():
                proctl.kill_and_wait(send, alive, KILL_WAIT_S, **wait)
    except (KeyboardInterrupt, Interrupted):
        console.say("second interrupt: killing all processes now")
        kill_now = True
        proctl.kill_and_wait(send, alive, KILL_WAIT_S, **wait)
    for t in running:
        t.stopped_by_launcher()
