"""Which process failed first, and so caused the others: the stall watchdog's verdict on a
process alive without progress (``stalled``), a process frozen by SIGSTOP that its peers died
waiting for (``frozen``), and among processes that ended, the one whose end the others
followed (``root_cause``). ``launcher.run.supervise`` asks these at each poll; what the
summary then says of the cause is ``launcher.run.classes``'.
"""

from __future__ import annotations

import time
from typing import Callable

from launcher.console import Console
from launcher.run import classes
from launcher.run.output import Output
from launcher.run.pauses import Pauses
from launcher.state import State, Tracked, Watchdog

# How long a process whose training is complete may go without progress while it ends
# (JAX's distributed shutdown waits for its peers) before the watchdog calls it stalled,
# when that is longer than watchdog.stall_timeout_s
FINISHED_SHUTDOWN_S = 60.0


def stalled(tracked: list, watchdog: Watchdog, started: float, console: Console,
             clock: Callable[[], float], pauses: Pauses | None = None) -> Tracked | None:
    """The stalled worker once a running one went without step progress past its
    timeout, or None: a stopped one if any (once it is past its own timeout),
    else the one furthest behind, then the one whose progress is oldest.

    When one is found, it carries the watchdog's verdict (``Tracked.stall``);
    ``_teardown(kill_now=True)`` then SIGKILLs every running worker at once. Time the
    launcher itself did not run (``pauses``: Ctrl-Z, a paused VM) is not counted.
    """
    if pauses is not None:
        pauses.observe()
        away = pauses.news()
        if away:
            console.say(f"the launcher did not run for {away:.1f} s (stopped or paused); that "
                        "time is not counted against the workers by the stall watchdog")
    now = clock()

    def age(t: Tracked) -> float:
        since = started if t.progress_at is None else t.progress_at
        return now - since - (pauses.within(since, now) if pauses is not None else 0.0)

    def limit(t: Tracked) -> float | None:
        if t.progress_at is None:
            return watchdog.first_step_timeout_s
        if t.finished and watchdog.stall_timeout_s is not None:
            # its training is complete (step N/N, done): ending waits on JAX's shutdown,
            # which waits for every peer, and sends no heartbeat; a stalled peer is still
            # caught by its own limit
            return max(watchdog.stall_timeout_s, FINISHED_SHUTDOWN_S)
        return watchdog.stall_timeout_s

    def over(t: Tracked) -> bool:
        bound = limit(t)
        if bound is None:
            return False
        since = started if t.progress_at is None else t.progress_at
        # pauses only shorten an age: one within its limit on the clock alone is within it
        # (every poll asks this of every process: 1,024 of them, bench/bench_supervise_scale.py)
        return now - since > bound and age(t) > bound

    running = [t for t in tracked if t.running]
    if not any(over(t) for t in running):
        return None
    # A stopped process (SIGSTOP, a debugger) is the cause, not its peers blocked in a
    # collective behind it. A peer may cross its limit first (heartbeats of different
    # processes have their own phase): then wait until the stopped one crosses its own,
    # or resumes (SIGCONT) and the run goes on.
    stopped = [t for t in running if t.worker.stopped()]
    if stopped and not any(over(t) for t in stopped):
        return None
    first = min([t for t in stopped if over(t)] or [t for t in running if over(t)],
                key=lambda t: (-1 if t.last_step is None else t.last_step, -age(t)))
    if first.progress_at is None:
        what = f"no first step after {age(first):.1f} s"
        limit_text = f"first_step_timeout_s {watchdog.first_step_timeout_s:g}"
    else:
        what = f"no step progress for {age(first):.1f} s"
        limit_text = f"stall_timeout_s {watchdog.stall_timeout_s:g}"
    if stopped:
        what += " (the process is stopped, e.g. by SIGSTOP)"
    steps = ", ".join(
        f"{t.plan.label} " + ("none" if t.last_step is None else
                              f"{t.last_step} ({now - t.progress_at:.1f} s ago)")
        for t in tracked)
    console.say(f"{first.plan.label} stalled: {what} ({limit_text}); last step seen of every process: {steps}; "
                f"killing every process (SIGKILL: a stuck or stopped process cannot act on SIGTERM)")
    first.mark_stalled(what)
    return first


READER_JOIN_S = 1.0
# How far apart two hosts' reports may lie from when this machine saw each end before their
# clocks are taken to differ (a host without NTP): a report queued behind output on an SSH
# channel arrives seconds late at most; one host's clock 60 s behind named its victim the
# cause, and the run an infrastructure fault.
CLOCKS_AGREE_S = 10.0


def clocks_agree(ended: list, host_time: Callable) -> bool:
    """Whether the hosts' clocks of ``ended`` (each one's ``host_time``) can order their ends:
    each end's lag, from its host's time to this machine's when it was seen
    (``Tracked.seen_end_wall``), within ``CLOCKS_AGREE_S`` of every other's. Else the order
    in which this machine saw them decides."""
    lags = [t.seen_end_wall - host_time(t) for t in ended if t.seen_end_wall is not None]
    return len(lags) < 2 or max(lags) - min(lags) <= CLOCKS_AGREE_S


def mark_clocks_off(ended: list, host_time: Callable) -> None:
    """Set ``Tracked.clock_behind_s`` on each of ``ended`` whose host's clock is more than
    ``CLOCKS_AGREE_S`` from the others' (positive: behind, negative: ahead), for the summary
    to name. The reference is the median lag of the hosts' and this machine's own (lag 0), so
    that one host off among several, or beside a launcher in step, is the one named."""
    lags = {id(t): t.seen_end_wall - host_time(t) for t in ended
            if t.seen_end_wall is not None and host_time(t) is not None}
    ordered = sorted([0.0, *lags.values()])
    reference = ordered[len(ordered) // 2]
    for t in ended:
        off = lags.get(id(t))
        if off is not None and abs(off - reference) > CLOCKS_AGREE_S:
            t.clock_behind_s = off - reference


def frozen(tracked: list, cause: Tracked) -> Tracked | None:
    """A process stopped (SIGSTOP, a paused VM, a debugger) while the failure seen first only
    lost a peer (``classes.follows_from_another``: JAX's coordination service aborted it when
    the stopped one's heartbeats ceased, jax-ml/jax#23599): the stopped one is the cause, marked
    stalled (killed at once, as the watchdog would), or None."""
    if not classes.follows_from_another(cause):
        return None
    stopped = [t for t in tracked if t.running and t.worker.stopped()]
    if not stopped:
        return None
    first = stopped[0]
    first.mark_stalled(f"stopped (SIGSTOP, a paused VM or a debugger) while its peers waited "
                       f"for it: JAX's coordination service ended {cause.plan.label} when "
                       f"{first.plan.label}'s heartbeats ceased; resume or stop what froze it "
                       "(kill -CONT, the VM's host)")
    return first


def root_cause(tracked: list, output: Output, clock: Callable[[], float],
                window_s: float = 0.3, cause_wait_s: float = 3.0) -> Tracked:
    """The failure that caused the others.

    A death cascades in milliseconds (peers see a reset collective and exit
    too), often within one poll; so wait a short window (``window_s``) for the
    cascade to show, or until every process has ended (nothing more can show:
    the window was 0.3 s of every restart's teardown when all ended at once).
    Then: a process whose last lines say it lost a peer (``classes.follows_from_another``,
    as the attempt's class reads it: a collective or the coordination service failed
    under it, and no error of its own) is a consequence,
    not a cause, so the others come first;
    while every failure seen is such a consequence and some process still
    runs, wait up to ``cause_wait_s`` more for the cause to be seen (its end
    can reach the launcher late: an exit report queued behind megabytes of
    output on an SSH channel, a loaded host). Among the causes, the earliest
    by host time (when the worker caught its error, or when its wrapper saw
    it end), else by when its output closed at the launcher. Launcher-side
    notice order is not evidence: processes are polled in process_id order,
    and reader threads lag under load.
    """
    def settle(until: float) -> None:
        while clock() < until and any(t.running for t in tracked):
            output.wait(0.02)
            for t in tracked:
                if t.running:
                    t.poll(clock)

    settle(clock() + window_s)
    last_chance = clock() + cause_wait_s
    while True:
        failed = [t for t in tracked if t.state is State.FAILED]
        # Its last lines say whether it lost a peer. An ended process's output is finite, but
        # its reader thread lags on a loaded machine: 0.2 s each left a victim's tail without
        # its peer-loss line, and the victim, seen ending first, was named the cause. Up to
        # READER_JOIN_S for all of them together on each pass (a reader that never ends costs
        # it once a pass; the passes end by cause_wait_s).
        joined_by = time.monotonic() + READER_JOIN_S
        for t in failed:
            if t.reader is not None:
                t.reader.join(timeout=max(0.0, joined_by - time.monotonic()))
        # the verdict's own reading of a consequence (classes.follows_from_another): the
        # peer-loss markers alone missed the coordination service's "Failed to send RPC ...
        # Socket closed", the words of a peer that was waiting at a barrier when process 0
        # died (a loaded machine's timing): the victim was named first, the cause second
        causes = [t for t in failed if not classes.follows_from_another(t)]
        if causes or not any(t.running for t in tracked) or clock() >= last_chance:
            break
        settle(min(clock() + 0.1, last_chance))
    candidates = causes or failed

    def host_time(t: Tracked):
        return t.failed_reported_at if t.failed_reported_at is not None else t.exit.at

    if all(host_time(t) is not None for t in candidates):
        if clocks_agree(candidates, host_time):
            # Each host timed its own process's failure: the host clocks (NTP) differ far
            # less than a cascade's milliseconds of traceback printing.
            return min(candidates, key=host_time)
        mark_clocks_off(candidates, host_time)  # named in the summary (console.status)
    return min(candidates, key=lambda t: (t.ended_at if t.eof_at is None else t.eof_at, t.ended_at))
