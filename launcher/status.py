"""The live status line, ``--show``, and the per-process numbers of the summary table.

Everything here is derived on the launcher side from the progress lines
workers already print (``worker.contract.PROGRESS_FORMAT``); no worker sends
anything extra. Nothing here imports jax or numpy.

The status line reads::

    4/4 running | step 40/100 | 81.2 steps/s | slowest p3 host-c (own 12.3 ms/step; median 1.1)

* ``k/N running``: processes still alive, of all.
* ``step``: the furthest step any process has logged.
* ``steps/s``: what the furthest process reported for its last interval.
* ``slowest``: the process whose own step time (its host work per step
  outside JAX, see ``worker.metrics``) is the largest; with
  workers that do not report it, the process with the lowest logged step.
  A process that has logged nothing while others have is the slowest.

On a terminal the line is redrawn in place (worker lines scroll above it); on
anything else it is printed as a plain ``podlaunch: status: ...`` line every
``status_every_s`` seconds.
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import threading
import time
from typing import Sequence, TextIO

from launcher.errors import Problem, SpecError
from worker import contract

CLEAR_LINE = "\r\x1b[K"  # carriage return, then erase to the end of the line (ANSI EL)


@dataclasses.dataclass
class ProcessStats:
    """What one process's progress lines said so far.

    Attributes:
      progress: the latest ``contract.Progress``, or None before the first.
      timed_steps: steps covered by reported intervals.
      timed_s: seconds those steps took (sum of step_time_s x steps per interval).
    """

    progress: contract.Progress | None = None
    timed_steps: int = 0
    timed_s: float = 0.0
    resumed_at: int = 0  # a resumed attempt's checkpoint step: its first interval starts there

    def observe(self, line: str) -> contract.Progress | None:
        """Update from one output line; returns its Progress, or None for other lines."""
        progress = contract.parse_progress(line)
        if progress is None:
            resumed = contract.parse_resumed_step(line)
            if resumed is not None and self.progress is None:
                self.resumed_at = resumed
            return None
        previous = self.progress.step if self.progress is not None else self.resumed_at
        if progress.step_time_s is not None and progress.step > previous:
            steps = progress.step - previous
            self.timed_steps += steps
            self.timed_s += progress.step_time_s * steps
        self.progress = progress
        return progress

    @property
    def mean_step_time_s(self) -> float | None:
        """Seconds per step over every reported interval (compilation excluded), or None."""
        return self.timed_s / self.timed_steps if self.timed_steps else None


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
                                 f"{num_processes} processes (0-{num_processes - 1})")])


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def status_text(tracked: Sequence) -> str:
    """One status line for ``supervise.Tracked`` processes (each with ``.stats`` and ``.state``)."""
    from launcher.supervise import State  # supervise imports this module

    running = [t for t in tracked if t.state is State.RUNNING]
    head = f"{len(running)}/{len(tracked)} running"
    reported = [t for t in tracked if t.stats.progress is not None]
    if not reported:
        return f"{head} | waiting for the first logged step"
    furthest = max(reported, key=lambda t: t.stats.progress.step).stats.progress
    parts = [head, f"step {furthest.step}/{furthest.num_steps}", f"{furthest.steps_per_s:.1f} steps/s"]
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
    return " | ".join(parts)


class StatusLine:
    """Draws the status line on a terminal, or prints it every few seconds elsewhere.

    Args:
      stream: the console stream.
      tty: redraw in place; default: ``stream.isatty()``.
      status_every_s: seconds between plain status lines when not a terminal (0 = never).
      redraw_every_s: the least seconds between redraws on a terminal.
    """

    def __init__(self, stream: TextIO, tty: bool | None = None, status_every_s: float = 5.0,
                 redraw_every_s: float = 0.2, clock=time.monotonic):
        self.stream = stream
        if tty is None:
            try:
                tty = stream.isatty()
            except (AttributeError, ValueError):
                tty = False
        self.tty = tty
        self.status_every_s = status_every_s
        self.redraw_every_s = redraw_every_s
        self.clock = clock
        self.lock = threading.RLock()
        self._text = ""      # what is (or would be) drawn
        self._drawn = False  # a status line is on the terminal now
        self._last = None    # clock of the last draw or plain line

    def write(self, text: str) -> None:
        """Write finished lines; on a terminal they go above the status line."""
        with self.lock:
            if self._drawn:
                self.stream.write(CLEAR_LINE)
            self.stream.write(text)
            if self._drawn:
                self.stream.write(self._fit(self._text))
            self.stream.flush()

    def update(self, text: str) -> None:
        """Show ``text`` as the current status (rate-limited)."""
        with self.lock:
            now = self.clock()
            if self.tty:
                if text == self._text and self._drawn:
                    return
                if self._last is not None and now - self._last < self.redraw_every_s:
                    return
                self._text, self._drawn, self._last = text, True, now
                self.stream.write(CLEAR_LINE + self._fit(text))
                self.stream.flush()
                return
            if self.status_every_s <= 0:
                return
            if self._last is None:
                self._last = now  # the first plain line comes after one interval, not at once
                return
            if now - self._last >= self.status_every_s:
                self._last = now
                self.stream.write(f"podlaunch: status: {text}\n")
                self.stream.flush()

    def end(self) -> None:
        """Erase the terminal status line (before the summary is printed)."""
        with self.lock:
            if self._drawn:
                self.stream.write(CLEAR_LINE)
                self.stream.flush()
            self._drawn, self._last, self._text = False, None, ""

    @staticmethod
    def _fit(text: str) -> str:
        # A line wider than the terminal wraps, and \r then redraws only its last row.
        columns = shutil.get_terminal_size((120, 24)).columns
        return text if len(text) < columns else text[:max(columns - 2, 10)] + "…"
