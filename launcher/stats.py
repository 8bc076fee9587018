"""What one process's lines said so far: its progress, step times, compilation, saves,
restores and profile traces (for the status line, the summary and the ledger); no I/O."""

from __future__ import annotations

import dataclasses

from worker.contract import profiling, wire


@dataclasses.dataclass
class ProcessStats:
    """What one process's progress lines said so far (for the status line and summary).

    Attributes:
      progress: the latest ``wire.Progress``, or None before the first.
      timed_steps: steps covered by reported intervals.
      timed_s: seconds those steps took (sum of step_time_s x steps per interval).
    """

    progress: wire.Progress | None = None
    timed_steps: int = 0
    timed_s: float = 0.0
    own_timed_s: float = 0.0  # of those seconds, the host's own (outside JAX: own_step_time_s)
    resumed_at: int = 0  # a resumed attempt's checkpoint step: its first interval starts there
    # its CACHE_FORMAT line: the persistent compilation cache's hits and misses, and the
    # first call's seconds (trace, compile, dispatch; None: not said)
    cache_hits: int | None = None
    cache_misses: int | None = None
    first_step_s: float | None = None
    # for the ledger (launcher.rundir.ledger), when lines arrived: the first step done (its CACHE_FORMAT
    # line, else its first progress line), the latest progress line, each save and restore (+ seconds)
    first_step_at: float | None = None
    progress_at: float | None = None
    saves: list = dataclasses.field(default_factory=list)      # [(at, seconds)]
    saved_step: int | None = None  # the newest checkpoint's step: every process has done it
    restores: list = dataclasses.field(default_factory=list)   # [(at, seconds)]
    profiles: list = dataclasses.field(default_factory=list)   # [worker.contract.profiling.Trace]

    def observe(self, line, now: float | None = None) -> wire.Progress | None:
        """Update from one output line read at ``now`` (its text, or ``wire.parse``'s type of
        it); returns its ``wire.Progress``, or None for other lines."""
        parsed = wire.parse(line) if isinstance(line, str) else line
        match parsed:
            case wire.Progress():
                self._progressed(parsed, now)
                return parsed
            case wire.CacheReport(hits=hits, misses=misses, seconds=seconds):
                self.cache_hits, self.cache_misses, self.first_step_s = hits, misses, seconds
                if self.first_step_at is None:
                    self.first_step_at = now
            case profiling.Trace():
                self.profiles.append(parsed)
            case wire.CheckpointSaved(step=step, seconds=seconds):
                self.saves.append((now, seconds))
                self.saved_step = max(step, self.saved_step or 0)
            case wire.Resumed(step=step, seconds=seconds):
                self.restores.append((now, seconds))
                if self.progress is None:
                    self.resumed_at = step
        return None

    def _progressed(self, progress: wire.Progress, now: float | None) -> None:
        if self.first_step_at is None:
            self.first_step_at = now
        self.progress_at = now
        previous = self.progress.step if self.progress is not None else self.resumed_at
        if progress.step_time_s is not None and progress.step > previous:
            steps = progress.step - previous
            self.timed_steps += steps
            self.timed_s += progress.step_time_s * steps
            if progress.own_step_time_s is not None:
                self.own_timed_s += progress.own_step_time_s * steps
        self.progress = progress

    @property
    def mean_step_time_s(self) -> float | None:
        """Seconds per step over every reported interval (compilation excluded), or None."""
        return self.timed_s / self.timed_steps if self.timed_steps else None

    @property
    def mean_own_step_time_s(self) -> float | None:
        """Of ``mean_step_time_s``, the host's own seconds per step (outside JAX: its input,
        its Python, the time it is not in a device call), or None. In a data-parallel step
        every process waits for the slowest in the all-reduce, so the whole step time is the
        same everywhere; the host's own time is what tells a slow host."""
        return self.own_timed_s / self.timed_steps if self.timed_steps else None
