"""What the training loop does around each device call: a list of step actions.

The loop (``worker.trainer.loop``) dispatches one call of k steps at a time (``worker.trainer.calls``);
everything else it does at a call is an action here, in the spirit of CLU's periodic
actions: each has ``after(call)``, run after the call's dispatch, and may have
``before(first, last)``, run before it. Adding a feature to the loop adds an action to its
list, not lines to the loop.

The contract every action keeps:

* It runs on the loop's thread, between two dispatches, in list order. It is told the
  call (``Call``): the call's first and last steps (1-based; the last is a call boundary,
  so a log, checkpoint or last step that is a multiple of k falls there) and its outputs,
  device arrays not waited for.
* It waits for the devices only when its work needs the call's values (a save, the end of
  a trace, a task's hook), and then through the logger's ``wait``: that time is counted as
  JAX's, not the host's own (``worker.telemetry.steptimer``). Logging itself never waits
  (``worker.telemetry.metrics``).
* Where one action's work must come first it says so here: a step's loss is read (and a
  non-finite one stops the run) before a save or a hook sees that step, so ``Save`` and
  ``Hook`` flush the logger first; ``Profile`` is first, so a trace's end waits for nothing
  the other actions add.
* It may raise to end the run (a non-finite loss, a hook's exit, a full disk), as the loop's
  own code may: the loop's ``finally`` closes everything.
* It is not run at a quiet call (``Quiet``): one with no step in it of a declared period
  that ends a call (``worker.contract.periods.ENDS_A_CALL``: checkpoint and last steps), no
  profile window's step, no notice, within ``QUIET_S`` of the last call the actions ran at.
  So work an action does by the clock (a heartbeat, a read of finished log steps, a profile
  request's poll) may come up to ``QUIET_S`` late, and work at a step must be declared as a
  period (or, for the profiler, be its ``next_step``). A period done at the next call end
  (``NEXT_CALL_END``: a local copy) is done at the first call with actions after its step,
  within ``QUIET_S``; a log step (``A_ROW``) in a quiet call has its rows kept by the logger
  there (``StepLogger.keep``: what ``Log`` does first; read at the next call with actions),
  or, where the loop cannot dispatch rows in a run of quiet calls, it ends the run
  (``worker.trainer.loop``). An action that must see every call (a task's hook) says
  ``every_call = True``: then no call is quiet.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

# Seconds of calls the loop may dispatch with no action around them (``Quiet``): at one
# step a call on one CPU device, the actions cost the call about 40% of its time
# (py-spy: the 256 x 4 step at 56k steps/s, the hand-written loop's at 90-97k)
QUIET_S = 0.01


class Call:
    """One device call as the actions see it.

    Attributes:
      first, step: its first and last optimizer steps (1-based).
      state: the state after it, the leaves of ``(params, opt_state)`` (replicated device
        arrays; ``worker.trainer.calls.StepCalls``): what to wait on for the call's work.
        The next call takes them (donated): an action keeps nothing of a call.
      step_metrics: its metrics rows (``worker.trainer.train.make_train_step``), device;
        None for a call none of whose steps is logged.
      params, opt_state: the state as trees, made on first use.
    """

    __slots__ = ("first", "step", "state", "step_metrics", "_unflatten", "_trees")

    def __init__(self, first: int, step: int, state: list, step_metrics,
                 unflatten: Callable[[list], tuple]):
        self.first, self.step, self.state, self.step_metrics = first, step, state, step_metrics
        self._unflatten, self._trees = unflatten, None

    @property
    def params(self):
        return self._tree()[0]

    @property
    def opt_state(self):
        return self._tree()[1]

    def _tree(self) -> tuple:
        if self._trees is None:
            self._trees = self._unflatten(self.state)
        return self._trees


class Profile:
    """Starts a ``profile:`` window's trace before the call that reaches it and ends it after
    the window's last call, once that call's work is done (``worker.telemetry.profiler.Profiler``)."""

    def __init__(self, profiler, wait: Callable[[Any], None]):
        self.profiler, self.wait = profiler, wait

    def before(self, first: int, last: int) -> None:
        self.profiler.before(first, last)

    def after(self, call: Call) -> None:
        self.profiler.after(call.step, self.wait, call.state)


class CacheLine:
    """After the first call (everything the loop compiles is compiled by then): the
    compilation cache's line, once (``worker.runtime.compilecache``)."""

    def __init__(self, cache, logger, out: Callable[[str], None]):
        self.cache, self.logger, self.out = cache, logger, out

    def after(self, call: Call) -> None:
        if self.cache is not None:
            self.out(self.cache.line(self.logger.compile_time_s))
            self.cache = None


class Log:
    """Keeps the call's log steps and reads the finished ones (``worker.telemetry.metrics.StepLogger``):
    no device sync."""

    def __init__(self, logger):
        self.logger = logger

    def after(self, call: Call) -> None:
        self.logger.after_dispatch(call.step, call.step_metrics)


class Save:
    """Process 0's periodic checkpoints (``worker.recovery.recovery.Recovery``). A save waits for its
    step anyway, so the logger reads that step's loss first: a non-finite loss is never
    saved."""

    def __init__(self, checkpoints, logger):
        self.checkpoints, self.logger = checkpoints, logger

    def after(self, call: Call) -> None:
        trees = (None, None)  # the state as trees only where a save needs them
        if self.checkpoints.saves(call.step):
            self.logger.flush()
            trees = (call.params, call.opt_state)
        self.checkpoints.after_step(call.step, *trees, call.state, wait=self.logger.wait)


class LocalCopy:
    """The local tier's copies (``worker.recovery.localtier.LocalTier``), none at the last step: the run
    is done, nothing is left to restart from."""

    def __init__(self, local, num_steps: int):
        self.local, self.num_steps = local, num_steps

    def after(self, call: Call) -> None:
        if call.step < self.num_steps and self.local.due(call.step):
            self.local.after_step(call.step, call.params, call.opt_state)


class Hook:
    """A task's ``on_step_end(step, process_id)``, for each step of the call in order, after
    the call is logged (the hook may end the process). It sees every call: none is quiet."""

    every_call = True

    def __init__(self, on_step_end: Callable[[int, int], None], logger, process_id: int):
        self.on_step_end, self.logger, self.process_id = on_step_end, logger, process_id

    def after(self, call: Call) -> None:
        self.logger.flush()
        self.logger.tracker.drain()  # written, not only queued: the hook may end the process
        for done in range(call.first, call.step + 1):
            self.on_step_end(done, self.process_id)


class Quiet:
    """Which calls the loop dispatches with no action before or after them.

    After each call the actions ran at (``ran``), the next call that needs them is the
    first whose steps reach the next multiple of any period given, or the profiler's
    ``next_step``; until then, and for at most ``QUIET_S`` seconds, calls are quiet. A
    task's ``on_step_end`` needs every call: then none is quiet.

    Args:
      period_steps: the periods that end a run of quiet calls, in steps (the loop's: those
        that end a call, ``worker.contract.periods.ENDS_A_CALL``, the last step's,
        ``train.num_steps``, among them; the log steps' where a run cannot dispatch rows).
      profiler: has ``next_step(step)`` (``worker.telemetry.profiler.Profiler``).
      every_call: no call is quiet (an action's ``every_call``: a task's hook).
      clock: seconds, monotonic.
    """

    def __init__(self, period_steps: Sequence[int], profiler, every_call: bool = False,
                 quiet_s: float = QUIET_S, clock: Callable[[], float] = time.perf_counter):
        self.period_steps = tuple(p for p in period_steps if p > 0)
        self.profiler, self.every_call = profiler, every_call
        self.quiet_s, self.clock = quiet_s, clock
        self.until: float = -math.inf   # a call ending before this step may be quiet
        self.deadline = -math.inf       # ... if it starts before this clock

    def quiet(self, last: int) -> bool:
        """Whether the call that ends at step ``last`` goes without the actions."""
        return last < self.until and self.clock() < self.deadline

    def ran(self, step: int) -> None:
        """The actions ran after the call that ended at ``step``."""
        if self.every_call:
            return
        until = min((step // p + 1) * p for p in self.period_steps) if self.period_steps \
            else math.inf
        self.until = min(until, self.profiler.next_step(step))
        self.deadline = self.clock() + self.quiet_s
