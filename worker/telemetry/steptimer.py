"""The two step times of a log step, and the first call's (``worker.telemetry.metrics`` explains them).

``StepTimer`` wraps the step function (``timed``): it times the first call (trace, compile,
dispatch: ``compile_time_s``), counts the optimizer steps dispatched, and sums the time spent
inside JAX (the calls, waits for the devices, logging's reads: ``charge``). ``take`` then
turns the interval since the previous log step into ``(step_time_s, own_step_time_s)``:
seconds per step, wall, and wall minus that JAX time. Per step: two clock reads, no sync.
"""

from __future__ import annotations

import time
from typing import Callable


class StepTimer:
    """Args:
      clock: seconds, monotonic (``time.perf_counter``).
      steps_per_call: optimizer steps each call of the timed step runs.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter, steps_per_call: int = 1):
        self.clock, self.steps_per_call = clock, steps_per_call
        self.compile_time_s: float | None = None  # the first call's seconds, until taken
        self.calls = 0                     # steps dispatched (steps_per_call per call)
        self._mark: float | None = None    # clock when the previous log step was timed
        self._mark_calls = 0
        self._not_own_s = 0.0              # time in JAX and in logging's reads since the mark

    def timed(self, step_fn: Callable) -> Callable:
        """``step_fn`` that times its first call and counts every call; results unchanged."""
        def counted(*args):
            start = self.clock()
            result = step_fn(*args)
            end = self.clock()
            if self._mark is None:
                self.compile_time_s = end - start
                # The first step ran after its dispatch returned: count it in the intervals.
                self._mark, self._mark_calls = end, self.calls
            else:
                self._not_own_s += end - start
            self.calls += self.steps_per_call
            return result
        return counted

    def snapshot(self) -> tuple:
        """The mark, to go back to with ``restore`` (a timing to redo with later steps)."""
        return self._mark, self._mark_calls, self._not_own_s

    def restore(self, snapshot: tuple) -> None:
        self._mark, self._mark_calls, self._not_own_s = snapshot

    def count(self, calls: int, seconds: float) -> None:
        """``calls`` calls dispatched without ``timed`` (the loop's quiet ones, after the
        first), ``seconds`` of them inside JAX."""
        self.calls += calls * self.steps_per_call
        self._not_own_s += seconds

    def charge(self, seconds: float) -> None:
        """``seconds`` spent outside the host's own work (JAX, logging's reads and writes)."""
        self._not_own_s += seconds

    def wait(self, array) -> None:
        """``jax.block_until_ready(array)``, the time counted as JAX's, not the host's own."""
        import jax

        start = self.clock()
        jax.block_until_ready(array)
        self.charge(self.clock() - start)

    def take(self, calls: int) -> tuple[float, float]:
        """``(step_time_s, own_step_time_s)`` of the log step dispatched when ``calls`` steps
        had been: the interval since the previous one, per step; the mark moves to now."""
        now = max(self.clock(), self._mark + 1e-9)  # never a zero interval (a rate of it)
        steps = max(1, calls - self._mark_calls)
        times = ((now - self._mark) / steps, max(0.0, now - self._mark - self._not_own_s) / steps)
        self._mark, self._mark_calls, self._not_own_s = now, calls, 0.0
        return times
