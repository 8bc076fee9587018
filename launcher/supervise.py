"""Watch every worker, stream its lines, fail fast, and tear everything down.

Backend-neutral: a backend hands over one ``Worker`` per process (a local
subprocess, a remote command over SSH, ...) and ``supervise`` does the rest:

* a reader thread per worker writes each line to ``logs/process-NNN.log``
  first (so nothing is lost) and queues it for the console with a ``[pN]`` prefix;
* the main thread polls every worker; the first one that exits non-zero, dies
  by a signal, or is lost, is the root cause. Every other worker then gets
  TERM to its process group, ``grace_s`` to exit, then KILL;
* Ctrl-C, SIGTERM or SIGHUP (the terminal went away) to the launcher stops everything
  the same way;
* the stall watchdog: a worker alive but without step progress (progress,
  heartbeat or failure lines) for ``stall_timeout_s`` (``first_step_timeout_s``
  before its first step) is a failure. The launcher reports the last step of
  every process and SIGKILLs them all at once: a stuck or stopped process
  cannot act on SIGTERM, and SIGKILL also ends a stopped one.

The failure report leads with the first failure by time, not the cascade it
caused (as torch.distributed.elastic does).
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from typing import Iterable

from launcher.console import Console
from launcher.state import Exit, Result, State, Tracked, Watchdog, Worker
from worker import contract


class Interrupted(Exception):
    """Ctrl-C, SIGTERM or SIGHUP reached the launcher."""


def _raise_interrupted(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def _pump(tracked: Tracked, out: queue.Queue) -> None:
    """Reader thread: log file first, then the console queue."""
    with open(tracked.plan.log_path, "a", encoding="utf-8", errors="replace") as log:
        try:
            for line in tracked.worker.lines():
                step = contract.parse_step(line)
                if step is not None:
                    tracked.last_step, tracked.progress_at = step, time.monotonic()
                    tracked.failed_at_step = contract.is_failure(line)
                if contract.is_heartbeat(line):
                    continue  # for the watchdog only
                log.write(line + "\n")
                log.flush()
                tracked.tail.append(line)
                tracked.stats.observe(line)
                out.put((tracked.plan.label, line, tracked.plan.process_id))
        except Exception as exc:  # a reader must never die silently
            out.put((tracked.plan.label, f"podlaunch: output stream broke: {exc!r}"))
        tracked.eof_at = time.monotonic()


def supervise(workers: Iterable[Worker], grace_s: float, console: Console,
              poll_interval_s: float = 0.05, watchdog: Watchdog | None = None) -> Result:
    """Run until every worker succeeded, one failed, or the launcher is interrupted.

    Args:
      workers: started workers, in process_id order.
      grace_s: seconds between SIGTERM and SIGKILL during teardown.
      console: where prefixed lines and launcher messages go.
      poll_interval_s: how often exits are checked.
      watchdog: stall timeouts; None: no watchdog.

    Returns:
      A Result; every worker has ended (or been killed) by the time it returns.
    """
    started = time.monotonic()
    lines: queue.Queue = queue.Queue()
    tracked = [Tracked(w) for w in workers]
    for t in tracked:
        t.reader = threading.Thread(target=_pump, args=(t, lines), daemon=True,
                                    name=f"reader-{t.plan.process_id}")
        t.reader.start()

    previous = {sig: signal.signal(sig, _raise_interrupted)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    first_failure: Tracked | None = None
    interrupted = False
    try:
        try:
            while True:
                _drain(lines, console, poll_interval_s)
                console.status(tracked)
                for t in tracked:
                    if t.state is State.RUNNING and _check(t) and not t.exit.ok and first_failure is None:
                        first_failure = t
                if first_failure is None and watchdog is not None:
                    first_failure = _stalled(tracked, watchdog, started, console)
                if first_failure is not None and first_failure.stall is not None:
                    break
                if first_failure is not None:
                    first_failure = _root_cause(tracked, lines, console)
                    console.say(f"{first_failure.plan.label} failed ({first_failure.exit}); "
                                f"stopping the other {sum(t.state is State.RUNNING for t in tracked)} processes")
                    break
                if all(t.state is not State.RUNNING for t in tracked):
                    break
        except (KeyboardInterrupt, Interrupted) as exc:
            interrupted = True
            console.say(f"interrupted ({exc or 'SIGINT'}); stopping all processes")
        _teardown(tracked, grace_s, lines, console)
        if first_failure is not None and first_failure.stall is not None:
            # killed by us after the teardown polled it; the stall is what it did
            first_failure.exit, first_failure.state = first_failure.stall, State.FAILED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for t in tracked:
        t.reader.join(timeout=2.0)
    _drain(lines, console, 0)
    console.end_status()
    return Result(tracked, first_failure, interrupted, time.monotonic() - started)


def _stalled(tracked: list, watchdog: Watchdog, started: float, console: Console) -> Tracked | None:
    """The running worker that went longest without step progress past its timeout, or None.

    When one is found, every running worker has been sent SIGKILL and the
    stalled one carries ``stall = Exit(stalled=...)``; ``_teardown`` reaps them.
    """
    now = time.monotonic()
    over = []
    for t in tracked:
        if t.state is not State.RUNNING:
            continue
        limit = watchdog.first_step_timeout_s if t.progress_at is None else watchdog.stall_timeout_s
        age = now - (t.progress_at or started)
        if limit is not None and age > limit:
            # A stopped process is the cause, not its peers blocked in a collective
            # within milliseconds of it: their ages tie, their states do not.
            stopped = t.worker.stopped()
            over.append((not stopped, t.last_step if t.last_step is not None else -1, -age, t))
    if not over:
        return None
    is_running, _, neg_age, first = min(over, key=lambda o: o[:3])
    if first.progress_at is None:
        what = f"no first step after {-neg_age:.1f} s"
        limit = f"first_step_timeout_s {watchdog.first_step_timeout_s:g}"
    else:
        what = f"no step progress for {-neg_age:.1f} s"
    if not is_running:
        what += " (the process is stopped, e.g. by SIGSTOP)"
        limit = f"stall_timeout_s {watchdog.stall_timeout_s:g}"
    steps = ", ".join(
        f"{t.plan.label} " + ("none" if t.last_step is None else
                              f"{t.last_step} ({now - t.progress_at:.1f} s ago)")
        for t in tracked)
    console.say(f"{first.plan.label} stalled: {what} ({limit}); last step seen of every process: {steps}; "
                f"killing every process (SIGKILL: a stuck or stopped process cannot act on SIGTERM)")
    for t in tracked:
        if t.state is State.RUNNING:
            t.worker.kill()
    first.stall = Exit(stalled=what)
    return first


def _root_cause(tracked: list, lines: queue.Queue, console: Console,
                window_s: float = 0.3) -> Tracked:
    """The failure that came first: by the end time its host reported (ssh), else
    by when its output closed at the launcher (local).

    A death cascades in milliseconds (peers see a reset collective and exit
    too), often within one poll; so wait a short window for the cascade to
    show, then lead with the earliest. Launcher-side notice order is not
    evidence: processes are polled in process_id order.
    """
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:
        _drain(lines, console, 0.02)
        for t in tracked:
            if t.state is State.RUNNING:
                _check(t)
    failed = [t for t in tracked if t.state is State.FAILED]
    for t in failed:
        if t.reader is not None:
            t.reader.join(timeout=0.2)
    if all(t.exit.at is not None for t in failed):
        # Each host timed its own process's end: arrival order at the launcher
        # depends on the network, the host clocks (NTP) far less than a cascade's
        # milliseconds of traceback printing.
        return min(failed, key=lambda t: t.exit.at)
    return min(failed, key=lambda t: (t.eof_at or t.ended_at, t.ended_at))


def _check(t: Tracked) -> bool:
    """Poll one running worker; record its end. True when it has ended."""
    ended = t.worker.poll()
    if ended is None:
        return False
    t.exit = ended
    t.ended_at = time.monotonic()
    t.state = State.SUCCEEDED if ended.ok else State.FAILED
    return True


def _drain(lines: queue.Queue, console: Console, wait_s: float) -> None:
    try:
        # (label, text) or (label, text, process_id): the id lets --show filter
        console.line(*(lines.get(timeout=wait_s) if wait_s else lines.get_nowait()))
        while True:
            console.line(*lines.get_nowait())
    except queue.Empty:
        pass


def _teardown(tracked: list, grace_s: float, lines: queue.Queue, console: Console) -> None:
    """TERM every running worker's process group, wait grace_s, then KILL."""
    running = [t for t in tracked if t.state is State.RUNNING]
    if not running:
        return
    try:
        for t in running:
            t.worker.terminate()
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(t.state is State.RUNNING for t in running):
            _drain(lines, console, 0.05)
            for t in running:
                if t.state is State.RUNNING:
                    _check(t)
    except (KeyboardInterrupt, Interrupted):
        console.say("second interrupt: killing all processes now")
    still = [t for t in running if t.state is State.RUNNING]
    if still:
        console.say(f"sending SIGKILL to {', '.join(t.plan.label for t in still)} "
                    f"(still running {grace_s:g}s after SIGTERM)")
        for t in still:
            t.worker.kill()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(t.state is State.RUNNING for t in still):
            for t in still:
                if t.state is State.RUNNING:
                    _check(t)
            time.sleep(0.02)
    for t in running:
        if t.state is not State.SUCCEEDED:
            t.state = State.STOPPED


