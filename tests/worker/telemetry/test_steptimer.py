"""worker.telemetry.steptimer: a log step's two times from the steps dispatched, on a clock the
test sets (issue 71: a timer that counted calls for steps, 100 steps a call, passed every fast
test; only a run's step times, read by a slow test or a benchmark, showed it)."""

from __future__ import annotations

import pytest

from worker.telemetry.steptimer import StepTimer


class Clock:
    """A clock that reads the next of ``ticks`` at each call."""

    def __init__(self, *ticks: float):
        self.ticks = list(ticks)

    def __call__(self) -> float:
        return self.ticks.pop(0)


def test_a_log_steps_times_are_per_optimizer_step_not_per_call():
    # 3 timed calls of 10 steps each, then 2 quiet calls (count) of 10 more: 50 steps
    clock = Clock(0.0, 2.0,   # the first call: compiled in 2 s, the mark at its end
                  2.0, 2.5,   # 0.5 s inside JAX
                  3.0, 3.5,   # 0.5 s more
                  7.0)        # take
    timer = StepTimer(clock=clock, steps_per_call=10)
    step = timer.timed(lambda x: x + 1)
    assert [step(n) for n in range(3)] == [1, 2, 3]
    assert timer.compile_time_s == 2.0 and timer.calls == 30
    timer.count(2, 0.4)
    assert timer.calls == 50
    step_time_s, own_step_time_s = timer.take(timer.calls)
    assert step_time_s == pytest.approx((7.0 - 2.0) / 50)
    assert own_step_time_s == pytest.approx((7.0 - 2.0 - 1.0 - 0.4) / 50)
    # the next log step counts from this one: 10 more steps in 1 s, 0.25 s of it JAX's
    timer.clock = Clock(7.0, 7.25, 8.0)
    step(0)
    assert timer.take(timer.calls) == pytest.approx((1.0 / 10, 0.75 / 10))
