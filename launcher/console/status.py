"""What the console says about processes: the status line's text, ``--show``, the summary.

Everything here is derived on the launcher side from the progress lines
workers already print (``worker.contract.wire.Progress``); no worker sends
anything extra. Nothing here imports jax or numpy.

The status line reads::

    4/4 running | step 40/100 | ETA 7.4s | elapsed 12s | loss 0.0123 | 81.2 steps/s | slowest p3 host-c (own 12.3 ms/step; median 1.1)

* ``k/N running``: processes still alive, of all.
* ``step``: the furthest step any process has logged.
* ``ETA``: the steps left times the furthest process's mean step time
  (compilation excluded), less the time since its last step line or
  heartbeat, so it counts down between progress lines.
* ``elapsed``: since the launch started.
* ``loss``: the furthest process's latest loss (the global batch's, the same on every process).
* ``steps/s``: what the furthest process reported for its last interval.
* ``slowest``: the process whose own step time (its host work per step
  outside JAX, see ``worker.telemetry.metrics``) is the largest; with
  workers that do not report it, the process with the lowest logged step.
  A process that has logged nothing while others have is the slowest.

``launcher.console`` draws it: on a terminal the line is redrawn in place
(worker lines scroll above it); on anything else it is printed as a plain
``podlaunch: status: ...`` line every ``status_every_s`` seconds.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from launcher.console import explain
from launcher.console import lines as kinds, traced
from launcher.words import duration, plural
from launcher.errors import Problem, SpecError
from launcher.state import Result, State, Tracked

def parse_show(text: str) -> frozenset | None:
    """``--show`` value -> the process_ids whose lines reach the console.

    Args:
      text: ``all``, ``none``, or comma-separated ids and inclusive ranges: ``0,3-5``.

    Returns:
      None for ``all``, else a frozenset of ints (empty for ``none``).

    Raises:
      SpecError: anything else, echoing the bad part.
    """
    text = text.strip()
    if text == "all":
        return None
    if text == "none":
        return frozenset()
    ids: set = set()
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high) if sep else int(low)
        except ValueError:
            first = last = -1
        if first < 0 or last < first:
            raise SpecError([Problem("--show", None, "", f"expected process_ids and ranges like "
                                     f"0,3-5 (or all, none), got {part.strip()!r} in {text!r}")])
        ids.update(range(first, last + 1))
    return frozenset(ids)


def check_show(show: frozenset | None, num_processes: int) -> None:
    """Raises SpecError when ``--show`` names a process_id the plan does not have."""
    if show is None:
        return
    beyond = sorted(i for i in show if i >= num_processes)
    if beyond:
        raise SpecError([Problem("--show", None, "", f"process_id {beyond[0]} is beyond this job's "
                                 f"{plural(num_processes, 'process')} (0-{num_processes - 1})")])


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def eta_s(t, now: float | None = None) -> float | None:
    """Seconds until ``t`` (a ``Tracked``) reaches its last step, or None before it can be told.

    The steps left times its mean wall time per step (``ProcessStats``,
    compilation excluded), less the time since its last step line or heartbeat.
    """
    progress, mean_s = t.stats.progress, t.stats.mean_step_time_s
    if progress is None or mean_s is None:
        return None
    step = max(progress.step, t.last_step or 0)
    left = max(progress.num_steps - step, 0) * mean_s
    if now is not None and t.progress_at is not None:
        left -= now - t.progress_at
    return max(left, 0.0)


# what a status line too wide for the terminal gives up first: the elapsed time, the slowest
# process's detail (its label stays), the rate, its host (its process id stays), then the
# slowest process altogether
FIT_ORDER = ("elapsed", "slowest detail", "rate", "slowest host", "slowest")


def status_text(tracked: Sequence, now: float | None = None, elapsed_s: float | None = None,
                width: int | None = None) -> str:
    """One status line for ``state.Tracked`` processes (each with ``.stats`` and ``.state``).

    Args:
      tracked: the processes.
      now: the clock ``Tracked.progress_at`` was read from, now: the ETA counts down between
        progress lines (None: the ETA as of the last one).
      elapsed_s: seconds since the launch started (None: not shown).
      width: the most characters the line may have (``fit``). None: whole.
    """
    running = [t for t in tracked if t.state is State.RUNNING]
    head = f"{len(running)}/{len(tracked)} running"
    elapsed = [] if elapsed_s is None else [f"elapsed {duration(elapsed_s)}"]
    reported = [t for t in tracked if t.stats.progress is not None]
    if not reported:
        return fit(" | ".join([head] + elapsed + ["waiting for the first logged step"]), width)
    lead = max(reported, key=lambda t: t.stats.progress.step)
    furthest = lead.stats.progress
    parts = [head, f"step {furthest.step}/{furthest.num_steps}"]
    eta = eta_s(lead, now)
    if eta is not None and furthest.step < furthest.num_steps:
        parts.append(f"ETA {duration(eta)}")
    parts += elapsed + [f"loss {furthest.loss:.4g}", f"{furthest.steps_per_s:.1f} steps/s"]
    candidates = running or tracked
    silent = [t for t in candidates if t.stats.progress is None]
    timed = [t for t in candidates if t.stats.progress is not None
             and t.stats.progress.own_step_time_s is not None]
    if silent:
        parts.append(f"slowest {silent[0].plan.label} (no step logged yet)")
    elif timed:
        owns = [t.stats.progress.own_step_time_s for t in timed]
        slow = max(timed, key=lambda t: t.stats.progress.own_step_time_s)
        detail = f"own {_ms(slow.stats.progress.own_step_time_s)} ms/step"
        if len(timed) > 1:
            detail += f"; median {_ms(statistics.median(owns))}"
        parts.append(f"slowest {slow.plan.label} ({detail})")
    elif candidates:
        slow = min(candidates, key=lambda t: t.stats.progress.step)
        parts.append(f"slowest {slow.plan.label} (step {slow.stats.progress.step})")
    return fit(" | ".join(parts), width)


def fit(text: str, width: int | None) -> str:
    """A status line (``status_text``'s, or one read back from a run's files) within
    ``width`` characters: its parts given up in ``FIT_ORDER`` until it fits, then it is cut
    with ``…``. A terminal's status line is given its columns less one (a line that fills
    the last column wraps, and a redraw then erases only its last row). None: as it is."""
    if width is None or len(text) <= width:
        return text
    parts = text.split(" | ")
    for step in FIT_ORDER:
        for i, part in enumerate(parts):
            if step == "elapsed" and part.startswith("elapsed "):
                parts[i] = ""
            elif step == "rate" and part.endswith(" steps/s"):
                parts[i] = ""
            elif part.startswith("slowest "):
                label = part[len("slowest "):].split(" (", 1)[0]
                parts[i] = {"slowest detail": f"slowest {label}",
                            "slowest host": f"slowest {label.split(' ', 1)[0]}",
                            "slowest": ""}.get(step, part)
        parts = [p for p in parts if p]
        text = " | ".join(parts)
        if len(text) <= width:
            return text
    return text[:max(width - 1, 1)] + "…"


def compile_text(processes: list) -> str | None:
    """One attempt's compilation, from its processes' cache lines: the slowest first step
    and the cache's hits and misses summed over processes; None when none reported."""
    seen = [t for t in processes if t.stats.cache_hits is not None]
    if not seen:
        return None
    timed = [t for t in seen if t.stats.first_step_s is not None]
    slowest = max(timed, key=lambda t: t.stats.first_step_s, default=None)
    first = ("first step -" if slowest is None else
             f"first step up to {slowest.stats.first_step_s:.3f} s ({slowest.plan.label})")
    hits = sum(t.stats.cache_hits for t in seen)
    misses = sum(t.stats.cache_misses for t in seen)
    return (f"compilation: {first}; cache {plural(hits, 'hit')}, {plural(misses, 'miss')} "
            f"over {plural(len(seen), 'process')}")


def summary(result: Result, run_s: float | None = None) -> str:
    """The end-of-run report; a failure report leads with the first failure's tail.

    ``run_s``: the run's seconds over every launch of its run directory (the ledger's), when
    known: where this launch's own differ (a resume, a take-back), the success says both, as
    the goodput line that follows it counts the run's."""
    lines = []
    first = result.first_failure
    if first is not None:
        if first.failed_to_join:
            step = f"while joining the coordinator at {first.joining}"
        elif first.last_step is None:
            step = "before its first logged step"
        elif first.failed_at_step:  # the worker said where it failed
            step = f"at step {first.last_step}"
        else:  # killed or exited without a word: log steps are read in batches, up to 0.25 s late
            step = f"after step {first.last_step}, its last logged step"
        lines.append(f"FAILED: process_id {first.plan.process_id} on {first.plan.host} "
                     f"({first.exit}) {step}; it failed first.")
        lines.append(f"last lines of {first.plan.log_path}:")
        # library chatter (gloo's start-up lines) is in the log; the tail is the worker's words.
        # A join that timed out waiting for a process that never began joining is said below
        # in our words: JAX's own fatal lines on it stay in the log too.
        late = _never_joined(result.processes, first.joining_timeout_s) \
            if first.failed_to_join else []
        shown = [line for line in first.tail
                 if not kinds.is_noise(line) and not (late and kinds.is_library_log(line))]
        lines += [f"  | {line}" for line in shown] or ["  | (no output)"]
        if late and len(shown) < len(first.tail):
            lines.append("  | (JAX's own lines on the timed-out join are in the log)")
        said = None if late else explain.meaning(first.tail)
        if said:
            lines.append(f"  what it usually means: {said}")
        for t in result.processes:  # the others' library texts, read once each
            if t is not first and t.state is State.FAILED:
                other = explain.meaning(t.tail)
                if other:
                    lines.append(f"p{t.plan.process_id} on {t.plan.host} ({t.exit}): {other}")
        lines += late
        lines += _clocks_off(result.processes)
    elif result.interrupted:
        lines.append("INTERRUPTED: every process was stopped.")
    lines += result.stacks  # read before the teardown (launcher.run.stacks)
    lines += _table(result.processes, first)
    lines += traced.summary_lines(result.processes)  # where the traces are, the slowest
    compiled = compile_text(result.processes)
    if compiled is not None:
        lines.append(compiled)
    reached = final_text(result.processes) if first is None else None  # a failure says its step
    if reached is not None:
        lines.append(reached)
    if first is None and not result.interrupted and result.exit_code == 0:
        lost = result.diverged_loss
        lines.append(f"OK: {plural(len(result.processes), 'process')} succeeded in "
                     f"{_took(result.elapsed_s, run_s)}." if lost is None else
                     f"DIVERGED: every step ran, but the final loss is {lost}: the training "
                     "diverged (lower optimizer.learning_rate, or look for extreme values in the "
                     "data); launch runs lists the run as diverged.")
    return "\n".join(lines)


def _clocks_off(processes: list) -> list:
    """A line for each host whose clock is off from the others' (``Tracked.clock_behind_s``):
    its processes' ends could not be ordered by their hosts' times."""
    lines = []
    for t in processes:
        off = t.clock_behind_s
        if off is not None:
            lines.append(f"note: {t.plan.host}'s clock (process_id {t.plan.process_id}) is about "
                         f"{abs(off):.0f} s {'behind' if off > 0 else 'ahead of'} the others': "
                         "which process failed first was decided by when this machine saw each "
                         "end; keep the hosts' clocks in step (NTP)")
    return lines


def _took(elapsed_s: float, run_s: float | None) -> str:
    """``3.5s``, or ``the run's 98.6 s, 15.2 s of them this launch's`` where the run's seconds
    over every launch (a take-back, a resume) are not this launch's (a tenth apart, a second
    at least)."""
    if run_s is None or abs(run_s - elapsed_s) <= max(1.0, 0.1 * run_s):
        return f"{elapsed_s:.1f}s"
    return f"the run's {run_s:.1f} s, {elapsed_s:.1f} s of them this launch's"


def final_text(processes: list) -> str | None:
    """``last logged step 300/300: loss 0.213406, accuracy 0.957``: the furthest logged step's
    loss and the job's own metrics (a task's ``accuracy``, a program's scalars), or None
    before any step was logged."""
    reported = [t.stats.progress for t in processes if t.stats.progress is not None]
    if not reported:
        return None
    furthest = max(reported, key=lambda p: p.step)
    return (f"last logged step {furthest.step}/{furthest.num_steps}: loss {furthest.loss:.6g}"
            + "".join(f", {name} {value:.4g}" for name, value in furthest.metrics))


def _never_joined(processes: list, timeout_s: float) -> list:
    """A line for each process that never reached ``jax.distributed.initialize`` (no JOINING
    line: a program that never calls it, a process stuck before it) while a peer timed out
    joining: the likely cause, which the launcher cannot tell from a slow start in time."""
    return [f"process_id {t.plan.process_id} on {t.plan.host} never began joining the "
            f"coordinator (no 'joining the coordinator' line); the processes that did waited "
            f"for it for distributed.initialization_timeout_s {timeout_s:g} s"
            for t in processes if t.joining is None and not t.joined]


def _table(processes: list, first: Tracked | None) -> list:
    """One row per process: host, state, exit, steps done, mean step time (ms), the first
    step's seconds (trace, compile, dispatch) and the compilation cache's hits/misses; headers
    short enough that a run on one host fits 80 columns (the line after the table,
    ``compile_text``, says what the last two are)."""
    header = ("process", "host", "state", "exit", "steps", "step ms", "first s", "cache")
    # a checkpoint of step N is saved once every process has done step N (its all-reduce):
    # a run stopped at an agreed step reports that step, not its last logged one
    saved = max((t.stats.saved_step for t in processes if t.stats.saved_step is not None),
                default=None)
    rows = []
    for t in processes:
        stats = t.stats
        mean_s = stats.mean_step_time_s
        done = max((s for s in (t.last_step, saved) if s is not None), default=None)
        rows.append((f"p{t.plan.process_id}", t.plan.host,
                     t.state.value + (" (first)" if t is first else ""), str(t.exit or "-"),
                     "-" if done is None else str(done),
                     "-" if mean_s is None else f"{mean_s * 1e3:.3f}",
                     "-" if stats.first_step_s is None else f"{stats.first_step_s:.3f}",
                     "-" if stats.cache_hits is None else f"{stats.cache_hits}/{stats.cache_misses}"))
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
    numeric = (4, 5, 6, 7)  # right-aligned columns
    return ["  ".join(cell.rjust(w) if i in numeric else cell.ljust(w)
                      for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
            for row in [header] + rows]
