"""The goodput ledger: where every second of a run went, per attempt, in named buckets.

Goodput is the share of a run's wall time that trained the model forward; the rest is
badput, split the way Google's ml-goodput-measurement splits it (initialization, program
startup, compilation, checkpoint save and restore, progress lost to a disruption,
recovery), but read from what the launcher already has: its own clock at each stage of
an attempt, and the arrival time of each worker line (``launcher.stats.ProcessStats``), plus the
seconds the workers say their checkpoint saves and restores took. Nothing is added to a
step.

An attempt's wall time, from the moment the launcher began preparing it to the moment
its last process had ended, is cut at the boundaries below (each the latest of its
processes, clamped so that they never go back in time); a restart's wait lies between
two attempts:

==================  ==========================================================
``launch``          spec, plan, preflight, and starting every process (a
                    restart's planning again)
``start_and_join``  interpreters, imports, ``jax.distributed.initialize``: to
                    the last process's ``joined`` line (a process that never
                    joined keeps it open to the failure)
``setup``           data, parameters, the task's setup: from the join to the
                    first step's compilation
``compilation``     the first step's trace, compile and dispatch, as measured:
                    the slowest process's own seconds (its compilation-cache
                    line), ending at the last process's first step
``restore``         the checkpoint restore (process 0's seconds), taken out of
                    the stretch its line arrived in
``productive``      steps that moved the run beyond any step it had reached
``checkpoint``      checkpoint saves (process 0's seconds)
``retrained``       steps trained again after a restart: from the checkpoint's
                    step to the furthest step an earlier attempt had logged,
                    at this attempt's mean step time
``teardown``        after a failure: from the last progress line to every
                    process ended (detection, the cause's wait, teardown)
``shutdown``        after a clean end: the last progress line to every process
                    ended (the final save is ``checkpoint``)
``restart_wait``    between attempts: the backoff and the end of the attempt
``unsupervised``    nothing ran and no supervisor could start it: the part of
                    a stretch nobody watched (from the last moment the killed
                    supervisor is known to have watched, its journal
                    ``launcher.rundir.journal``, to the moment ``launch
                    attach`` took the run back) that lay before the attempt's
                    processes had started, or in a restart's wait
==================  ==========================================================

The buckets add up to the attempt's wall time exactly (every one is a difference of
the same clock), so the run's add up to its wall time; the ``ledger.json`` of a run
directory keeps every launch's attempts (``--resume`` adds to it).

A stretch nobody watched while the attempt's processes ran is not a bucket: they trained
on, and its seconds stay in the stages they lay in (steps reached then are productive
unless trained again after a restart, as any step). Its length is a fact beside the
buckets, ``unwatched_s``, in each entry and the run's totals.
"""

from __future__ import annotations

import dataclasses
import json
import os

from worker.contract import runfiles
from launcher.words import GLOSSARY, plural
from launcher.state import HOST_CHANGE_FIELDS, Result
from launcher.rundir.watcher import RunWatcher

LEDGER_FILE = "ledger.json"
BUCKETS = ("launch", "start_and_join", "setup", "compilation", "restore", "productive",
           "checkpoint", "retrained", "teardown", "shutdown", "restart_wait", "unsupervised")
# the ledger's words for each bucket (the summary, docs/recovery.md)
WORDS = {"launch": "launch and preflight", "start_and_join": "process start and join",
         "setup": "data and parameters before the first step",
         "compilation": "compiling the first step", "restore": "checkpoint restore",
         "productive": "productive steps", "checkpoint": "checkpoint saves",
         "retrained": "steps trained again", "teardown": "failure detection and teardown",
         "shutdown": "shutdown", "restart_wait": "waiting before a restart",
         "unsupervised": "no supervisor to start the run's processes (killed, until taken back)"}


@dataclasses.dataclass
class Times:
    """The launcher's clock (``time.monotonic``, seconds) at an attempt's stages.

    Attributes:
      began_at: it began to be prepared (the launch, or a restart's planning).
      started_at: every process had been started.
      ended_at: every process had ended (``supervise`` returned).
      waited_s: seconds waited after it before the next attempt began (``restart_wait``).
      unsupervised: ``(from, to)`` of each stretch no supervisor watched it (``unwatched_s``;
        its part before ``started_at`` is the ``unsupervised`` bucket).
    """

    began_at: float
    started_at: float | None = None
    ended_at: float | None = None
    waited_s: float = 0.0
    unsupervised: list = dataclasses.field(default_factory=list)


def attempt_entry(number: int, times: Times, result, reached_before: int | None) -> dict:
    """One attempt's ledger: ``{"attempt", "wall_s", "buckets_s", "steps", ...}``.

    Args:
      number: the attempt's number.
      times: its ``Times`` (started_at/ended_at None: it never started; all is ``launch``).
      result: its ``state.Result`` (None: it never started).
      reached_before: the furthest step any earlier attempt of the run logged, or None.

    Returns:
      A dict for ``ledger.json``: ``wall_s``, ``buckets_s`` (every name in ``BUCKETS``,
      seconds, summing to ``wall_s`` + ``restart_wait``), ``resumed_step`` (the checkpoint's
      step it began after; 0 for a fresh start), ``reached_step`` (the furthest step it
      logged: progress lines and its own failure line), ``steps_again`` (of the steps from
      ``resumed_step``, how many an earlier attempt had logged; the steps a fault cut
      before they were logged are in ``teardown`` instead).
    """
    buckets = dict.fromkeys(BUCKETS, 0.0)
    entry = {"attempt": number, "buckets_s": buckets, "resumed_step": 0, "reached_step": None,
             "steps_again": 0, "unwatched_s": round(sum(max(0.0, b - a)
                                                       for a, b in times.unsupervised), 3)}
    end = times.ended_at if times.ended_at is not None else times.started_at
    if times.started_at is None or end is None or result is None:
        buckets["launch"] = max(0.0, (end or times.began_at) - times.began_at)
        idle = min(entry["unwatched_s"], buckets["launch"])  # nothing of it ever started
        buckets["launch"] -= idle
        buckets["unsupervised"] += idle
        return _finish(entry, times)
    processes = result.processes
    stats = [t.stats for t in processes]

    # a failure's detection: the stages its attempt never reached end there, and the rest
    # is teardown (a stall has no such moment: its wait is the stretch after the last step)
    failure = result.first_failure
    cut = end
    if failure is not None and failure.stall is None and failure.ended_at is not None:
        cut = min(max(failure.ended_at, times.began_at), end)

    def latest(values, floor: float) -> float:
        """The latest of every process's time, clamped to [floor, cut]; ``cut`` when some
        process never got there (it is still the stage the attempt was in)."""
        if not values or any(v is None for v in values):
            return max(cut, floor)
        return min(max(max(values), floor), max(cut, floor))

    start = min(max(times.started_at, times.began_at), end)
    # A join is a stage when a process began one (its JOINING line): to the last JOINED line,
    # held open to the failure by a process that never joined (a host late at a restart:
    # the wait is joining, not compilation); one process never joins.
    joins = any(t.joining is not None or t.joined for t in processes)
    joined = latest([t.joined_at for t in processes], start) if joins else start
    first_step = latest([s.first_step_at for s in stats], joined)
    # Compilation as measured: the slowest first step's own seconds (trace, compile,
    # dispatch), which end at the first step; the rest since the join is setup (the data,
    # the parameters), never compilation by inference.
    compiled_s = max([s.first_step_s for s in stats if s.first_step_s is not None], default=0.0)
    compiling = first_step - min(compiled_s, first_step - joined)
    last_progress = max([s.progress_at for s in stats if s.progress_at is not None],
                        default=first_step)
    last_progress = min(max(last_progress, first_step), max(cut, first_step))
    spans = {"launch": start - times.began_at, "start_and_join": joined - start,
             "setup": compiling - joined, "compilation": first_step - compiling,
             "productive": last_progress - first_step}
    ended_clean = result.exit_code == 0
    spans["shutdown" if ended_clean else "teardown"] = end - last_progress
    buckets.update(spans)
    edges = [(start, "launch"), (joined, "start_and_join"), (compiling, "setup"),
             (first_step, "compilation"), (last_progress, "productive"),
             (end, "shutdown" if ended_clean else "teardown")]

    def take(at: float | None, seconds: float, into: str) -> None:
        """Move ``seconds`` of the stretch the line arrived in (at ``at``) to ``into``."""
        if at is None or seconds <= 0:
            return
        source = next((name for edge, name in edges if at <= edge), edges[-1][1])
        moved = min(seconds, buckets[source])
        buckets[source] -= moved
        buckets[into] += moved

    zero = stats[0] if stats else None
    if zero is not None:
        for at, seconds in zero.restores:
            take(at, seconds, "restore")
        for at, seconds in zero.saves:
            take(at, seconds, "checkpoint")
    # A stretch nobody watched: its part before the processes had started ran nothing (the
    # bucket); while they ran they trained on, so that part stays where it lay.
    for gap_from, gap_to in times.unsupervised:
        idle_to = min(gap_to, start)
        take(idle_to, idle_to - gap_from, "unsupervised")
    # the furthest step its logs show: progress lines and a worker's own failure line (a
    # heartbeat's step is for the watchdog, and not logged)
    reached = max([t.stats.progress.step for t in processes if t.stats.progress is not None]
                  + [t.last_step for t in processes if t.failed_at_step and t.last_step is not None],
                  default=None)
    resumed = max((s.resumed_at for s in stats), default=0)
    entry["resumed_step"], entry["reached_step"] = resumed, reached
    if reached_before is not None and reached is not None and reached_before > resumed:
        again = min(reached, reached_before) - resumed
        entry["steps_again"] = again
        step_s = [s.mean_step_time_s for s in stats if s.mean_step_time_s is not None]
        if step_s:
            moved = min(buckets["productive"], again * max(step_s))
            buckets["productive"] -= moved
            buckets["retrained"] += moved
    return _finish(entry, times)


def _finish(entry: dict, times: Times) -> dict:
    buckets = entry["buckets_s"]
    buckets["restart_wait"] = max(0.0, times.waited_s)
    entry["wall_s"] = round(sum(buckets.values()), 3)
    entry["buckets_s"] = {name: round(value, 3) for name, value in buckets.items()}
    return entry


def totals(entries: list) -> dict:
    """The run's ledger from its attempts' entries: ``wall_s``, ``buckets_s``, ``goodput``
    (productive / wall, 0..1; None for no time at all) and ``largest_badput`` (the badput
    bucket with the most seconds, or None)."""
    buckets = {name: round(sum(e["buckets_s"].get(name, 0.0) for e in entries), 3)
               for name in BUCKETS}
    wall = round(sum(buckets.values()), 3)
    badput = {name: v for name, v in buckets.items() if name != "productive" and v > 0}
    largest = max(badput, key=badput.get) if badput else None
    return {"wall_s": wall, "buckets_s": buckets,
            "goodput": round(buckets["productive"] / wall, 4) if wall > 0 else None,
            "largest_badput": largest,
            "steps_again": sum(e.get("steps_again", 0) for e in entries),
            "unwatched_s": round(sum(seconds(e.get("unwatched_s")) for e in entries), 3)}


def seconds(value) -> float:
    """A number of seconds read from ``ledger.json`` (a file: anything else counts 0)."""
    return float(value) if isinstance(value, (int, float)) and value > 0 else 0.0


ONE_OFF = ("launch", "start_and_join", "setup", "compilation", "shutdown")  # paid once, however long


def summary_line(run: dict) -> str | None:
    """``goodput 0.83: 41.2 s of the run's 49.6 s went into training steps that count; largest
    loss of time (badput): compiling the first step 3.1 s`` for a run's ``totals``, or
    None when there is no time. A one-off start-up or shutdown cost as the largest loss is said
    to be one (a short first run's low goodput is no fault), and the glossary is named."""
    if run.get("goodput") is None:
        return None
    productive, wall = run["buckets_s"]["productive"], run["wall_s"]
    text = (f"goodput {run['goodput']:.2f}: {productive:.1f} s of the run's {wall:.1f} s went into "
            "training steps that count")
    largest = run.get("largest_badput")
    if largest is not None:
        text += (f"; largest loss of time (badput): {WORDS[largest]} "
                 f"{run['buckets_s'][largest]:.1f} s")
        if largest in ONE_OFF:
            text += ", paid once however long the run"
    if run.get("steps_again"):
        text += f"; {plural(run['steps_again'], 'step')} trained again"
    if run.get("unwatched_s"):
        text += (f"; {run['unwatched_s']:.1f} s without a supervisor (killed, until taken "
                 "back): the steps trained meanwhile count")
    return text + f" ({GLOSSARY})"


def read(run_dir: str) -> list:
    """The attempts' entries of ``<run_dir>/ledger.json`` ([] when absent or unreadable)."""
    try:
        data = json.loads(runfiles.read_regular(os.path.join(run_dir, LEDGER_FILE)))
    except (OSError, ValueError, RecursionError):  # a link among them: never read through
        return []
    attempts = data.get("attempts") if isinstance(data, dict) else None
    return [a for a in attempts if isinstance(a, dict) and isinstance(a.get("buckets_s"), dict)] \
        if isinstance(attempts, list) else []


def write(run_dir: str, entries: list) -> dict:
    """Write ``<run_dir>/ledger.json``: ``{"run": totals, "attempts": entries}``, replaced
    whole through a temporary of its own (``worker.contract.runfiles``: a link planted in the run
    directory is replaced, never written through); returns the run's totals.

    Raises:
      OSError: the file could not be written.
    """
    run = totals(entries)
    runfiles.write_whole(os.path.join(run_dir, LEDGER_FILE),
                         json.dumps({"run": run, "attempts": entries}, indent=1) + "\n")
    return run


def add_attempts(earlier: list, attempts: list) -> list:
    """``earlier`` entries (``read``) followed by an entry for each ``restarts.Attempt`` of
    this launch that has ``times``; each attempt's steps trained again count against the
    furthest step of every entry before it."""
    entries = list(earlier)
    for attempt in attempts:
        if attempt.times is None:
            continue
        before = max((e["reached_step"] for e in entries
                      if isinstance(e.get("reached_step"), int)), default=None)
        entry = attempt_entry(attempt.number, attempt.times, attempt.result, before)
        if getattr(attempt, "host_changes", None):
            entry["host_changes"] = [{k: c.get(k) for k in HOST_CHANGE_FIELDS}
                                     for c in attempt.host_changes]
        entries.append(entry)
    return entries


class Running(RunWatcher):
    """The ledger's figures while a launch goes on, for ``launch runs``' goodput so far
    (``launcher.rundir.record``): the entries of the run's earlier launches (``ledger.json``),
    this launch's ended attempts, and the attempt under way as if it ended now.

    A run watcher (``launcher.rundir.watcher``): the restart loop keeps ``attempts`` (this
    launch's ended ones, ``restarts.Attempt``) and ``current`` (the number and ``Times`` of the
    attempt whose processes run now, or None) up to date; nothing is written here
    (``ledger.json`` is written once, at the end: ``Written``).
    """

    def __init__(self, earlier: list):
        self.earlier = earlier
        self.attempts: list = []
        self.current: tuple | None = None  # (attempt number, Times) while its processes run

    def attempt_started(self, loop, times, workers: list) -> None:
        self.attempts, self.current = loop.attempts, (loop.number, times)

    def attempt_ended(self, loop, attempt, wait_s: float | None) -> None:
        self.current = None  # among the attempts now

    def goodput(self, tracked: list, now: float) -> float | None:
        """Productive seconds / wall seconds of the run so far, ``now`` on the clock of
        ``Times`` (the attempt under way is cut there: its time since its last progress line is
        not productive yet), with ``tracked`` its processes; None for no time at all."""
        entries = add_attempts(self.earlier, self.attempts)
        if self.current is not None:
            number, times = self.current
            if times.started_at is not None:
                before = max((e["reached_step"] for e in entries
                              if isinstance(e.get("reached_step"), int)), default=None)
                live = dataclasses.replace(times, ended_at=max(now, times.started_at))
                result = Result(list(tracked), first_failure=None, interrupted=False, elapsed_s=0.0)
                entries.append(attempt_entry(number, live, result, before))
        return totals(entries)["goodput"] if entries else None


class Written(RunWatcher):
    """``ledger.json`` written as the launch ends (a run watcher): this launch's attempts added
    to the earlier launches' entries; the ``Ending`` gets every entry, the run's goodput and
    the moment the entries count to. A ledger that cannot be written is said (``say``) and
    the run's end goes on."""

    def __init__(self, run_dir: str, say):
        self.run_dir, self.say = run_dir, say

    def run_ended(self, ending) -> None:
        ending.ended_at = end_of(ending.attempts)
        ending.entries = add_attempts(read(self.run_dir), ending.attempts or ())
        if not ending.entries:
            return
        try:
            ending.goodput = write(self.run_dir, ending.entries)["goodput"]
        except OSError as exc:
            self.say(f"cannot write {os.path.join(self.run_dir, LEDGER_FILE)} ({exc.strerror})")
            ending.goodput = totals(ending.entries)["goodput"]


def end_of(attempts) -> float | None:
    """The moment (``time.monotonic``) a launch's ledger entries count to: its last attempt's
    end and wait (run.json's duration ends there too), or None for no attempt."""
    timed = [a.times for a in attempts or () if getattr(a, "times", None) is not None
             and a.times.ended_at is not None]
    return timed[-1].ended_at + max(0.0, timed[-1].waited_s) if timed else None
