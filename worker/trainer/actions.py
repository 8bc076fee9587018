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
"""

from __future__ import annotations

from typing import Any, Callable


class Call:
    """One device call as the actions see it.

    Attributes:
      first, step: its first and last optimizer steps (1-based).
      params, opt_state: the state after it (replicated device arrays).
      loss: the call's loss, ``[local_device_count, ...]`` float32 (device).
      step_metrics: its metrics rows (``worker.trainer.train.make_train_step``), device.
    """

    __slots__ = ("first", "step", "params", "opt_state", "loss", "step_metrics")

    def __init__(self, first: int, step: int, params, opt_state, loss, step_metrics):
        self.first, self.step = first, step
        self.params, self.opt_state, self.loss, self.step_metrics = (
            params, opt_state, loss, step_metrics)


class Profile:
    """Starts a ``profile:`` window's trace before the call that reaches it and ends it after
    the window's last call, once that call's work is done (``worker.telemetry.profiler.Profiler``)."""

    def __init__(self, profiler, wait: Callable[[Any], None]):
        self.profiler, self.wait = profiler, wait

    def before(self, first: int, last: int) -> None:
        self.profiler.before(first, last)

    def after(self, call: Call) -> None:
        self.profiler.after(call.step, self.wait, call.loss)


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
        if self.checkpoints.saves(call.step):
            self.logger.flush()
        self.checkpoints.after_step(call.step, call.params, call.opt_state, call.loss,
                                    wait=self.logger.wait)


class LocalCopy:
    """The local tier's copies (``worker.recovery.localtier.LocalTier``), none at the last step: the run
    is done, nothing is left to restart from."""

    def __init__(self, local, num_steps: int):
        self.local, self.num_steps = local, num_steps

    def after(self, call: Call) -> None:
        if call.step < self.num_steps:
            self.local.after_step(call.step, call.params, call.opt_state)


class Hook:
    """A task's ``on_step_end(step, process_id)``, for each step of the call in order, after
    the call is logged (the hook may end the process)."""

    def __init__(self, on_step_end: Callable[[int, int], None], logger, process_id: int):
        self.on_step_end, self.logger, self.process_id = on_step_end, logger, process_id

    def after(self, call: Call) -> None:
        self.logger.flush()
        self.logger.tracker.drain()  # written, not only queued: the hook may end the process
        for done in range(call.first, call.step + 1):
            self.on_step_end(done, self.process_id)
