"""What a worker measures and logs at log steps: timing, norms, the per-process gather.

The training loop stays a few lines; everything it reports goes through one
``StepLogger``:

* ``timed(step_fn)`` wraps the pmapped step to time its first call (trace +
  compile + dispatch, so ``compile_time_s`` needs no device sync), to count
  steps, and to sum the time spent inside the calls. Per step that is two
  clock reads and no device sync.
* ``after_dispatch(step, loss, norms)``: notes a log step's outputs and logs
  the log steps whose outputs are ready without waiting: at most
  ``lag`` (``InFlight.max_steps``) steps are in flight, so step s has finished
  once step s + lag has been dispatched. Logging reads loss and norms in one
  ``device_get``, prints the progress line, gathers every process's own step
  time to process 0 when TensorBoard is on (one JAX collective,
  ``multihost_utils.process_allgather``; every process logs the same steps at
  the same points), writes the scalars, and checks the loss. No step is ever
  waited for here.
* ``flush()`` after the loop: waits for and logs the remaining log steps
  (the last step among them).

Two step times (seconds per step since the previous log step):

* ``step_time_s``: wall time, between the moments two log steps are read. In
  a synchronous data-parallel run every process waits for the slowest one
  inside the collectives, so this is the same on every process: it says how
  fast the run goes, not who holds it back.
* ``own_step_time_s``: that wall time minus the time this process spent
  inside JAX (the step calls, where a process blocks when its peers are
  behind, reading log steps back, and the gather): its own host work per
  step (input, Python, a task's hooks). A straggling host (slow input, a busy
  CPU) has the largest. Time blocked in a step call is left out because it mixes a
  process's own dispatch with waiting for peers (the first steps wait for the
  slowest compilation); so a device that computes slowly is not singled out
  here, it shows in everyone's ``step_time_s``.
"""

from __future__ import annotations

import collections
import json
import math
import time
from typing import Any, Callable

from worker import contract

NONFINITE_MODES = ("stop", "warn")


def process_tag(process_id: int) -> str:
    """The TensorBoard tag of one process's own step time, e.g. ``step_time_s/process_003``."""
    return f"step_time_s/process_{process_id:03d}"


def flatten(tree: Any, prefix: str = "") -> dict:
    """Nested dicts/lists -> ``{"a.b.0": value}`` with values TensorBoard's hparams accept.

    Returns:
      A flat dict of bool, int, float or str (None and anything else become strings).
    """
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return {prefix: tree if isinstance(tree, (bool, int, float, str)) else str(tree)}
    out: dict = {}
    for key, value in items:
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def spec_markdown(job: dict) -> str:
    """The resolved job as an indented (preformatted) Markdown block for TensorBoard's text tab."""
    text = json.dumps(job, indent=2, sort_keys=False, default=str)
    return "\n".join("    " + line for line in text.splitlines())


def json_value(value: float) -> float | None:
    """``value`` for strict JSON: non-finite numbers (NaN, inf) become None (``null``)."""
    return value if math.isfinite(value) else None


class StepLogger:
    """Times the training loop and writes what it measures at log steps.

    Args:
      job: the resolved job (``job.json``): reads ``train``, ``optimizer`` and
        ``logging`` (``log_every_steps``, ``tensorboard``, ``on_nonfinite_loss``).
      process_id, num_processes: this process's identity.
      tracker: a ``worker.tracker`` tracker (real on process 0, no-op elsewhere).
      out: prints one line (progress lines go to the launcher).
      clock: seconds, monotonic (``time.perf_counter``).
      lag: steps after which a dispatched step has finished (``InFlight.max_steps``).
    """

    def __init__(self, job: dict, process_id: int, num_processes: int, tracker, out=print,
                 clock: Callable[[], float] = time.perf_counter, lag: int = 2):
        logging = job["logging"]
        self.log_every = logging["log_every_steps"]
        self.on_nonfinite = logging.get("on_nonfinite_loss", "stop")
        if self.on_nonfinite not in NONFINITE_MODES:
            raise ValueError(f"logging.on_nonfinite_loss: expected one of {NONFINITE_MODES}, "
                             f"got {self.on_nonfinite!r}")
        # Every process takes the same branch (the spec is shared), so the
        # collective in log() is entered by all of them or by none.
        self.gather = bool(logging["tensorboard"]) and num_processes > 1
        self.num_steps = job["train"]["num_steps"]
        self.global_batch_size = job["train"]["global_batch_size"]
        self.learning_rate = job["optimizer"]["learning_rate"]
        self.process_id, self.num_processes = process_id, num_processes
        self.tracker, self.out, self.clock, self.lag = tracker, out, clock, lag
        self.hparams = flatten({k: v for k, v in job.items() if k != "cluster"})
        self.compile_time_s: float | None = None
        self.last_loss: float | None = None
        self._calls = 0
        self._pending: collections.deque = collections.deque()  # (step, calls, loss, norms)
        self._mark: float | None = None    # clock when the previous log step was read
        self._mark_calls = 0
        self._in_jax_s = 0.0               # time inside JAX since the mark
        tracker.text("spec", spec_markdown(job), step=0)
        if self.gather:  # compile the gather now, not inside the first timed interval
            gather_process_values(0.0)

    def timed(self, step_fn: Callable) -> Callable:
        """``step_fn`` that times its first call and counts every call; results unchanged."""
        def counted(*args):
            start = self.clock()
            result = step_fn(*args)
            end = self.clock()
            if self._mark is None:
                self.compile_time_s = end - start
                # The first step ran after its dispatch returned: count it in the intervals.
                self._mark, self._mark_calls = end, self._calls
            else:
                self._in_jax_s += end - start
            self._calls += 1
            return result
        return counted

    def is_log_step(self, step: int) -> bool:
        """Log steps: every ``log_every_steps``-th step, and the last one."""
        return step % self.log_every == 0 or step == self.num_steps

    def after_dispatch(self, step: int, loss, norms: dict) -> None:
        """After dispatching ``step``: note it if it is a log step; log every ready log step.

        Args:
          step: the step just dispatched (counts from 1).
          loss: ``[local_device_count]`` float32 device array (equal on every device).
          norms: ``{"grad_norm", "param_norm"}``, each ``[local_device_count]`` float32.

        Raises:
          FloatingPointError: see ``log``.
        """
        if self.is_log_step(step):
            self._pending.append((step, self._calls, loss, norms))
        while self._pending and self._pending[0][0] <= step - self.lag:
            self.log(*self._pending.popleft())

    def flush(self) -> None:
        """After the last dispatch: wait for the log steps not logged yet and log them."""
        while self._pending:
            self.log(*self._pending.popleft())

    def log(self, step: int, calls: int, loss, norms: dict) -> dict:
        """Log one log step: read its outputs, print progress, write scalars, check the loss.

        Args:
          step: the log step.
          calls: step calls made up to and including ``step``'s.
          loss, norms: that step's outputs (see ``after_dispatch``).

        Returns:
          The scalars written (tag -> float), also for non-zero processes.

        Raises:
          FloatingPointError: the loss is NaN or infinite and
            ``logging.on_nonfinite_loss`` is ``stop``; the message names the step,
            and so does the exception's ``step`` attribute.
        """
        import jax

        start = self.clock()
        fetched = jax.device_get({"loss": loss, **norms})  # no wait once the step has finished
        synced = self.clock()
        self._in_jax_s += synced - start  # flush() may wait for the step: not this host's own time
        steps = max(1, calls - self._mark_calls)
        step_time_s = (synced - self._mark) / steps
        own_step_time_s = max(0.0, synced - self._mark - self._in_jax_s) / steps
        self._mark, self._mark_calls, self._in_jax_s = synced, calls, 0.0

        values = {name: float(value[0]) for name, value in fetched.items()}
        loss_value = values["loss"]
        self.last_loss = loss_value
        self.out(contract.PROGRESS_FORMAT.format(
            step=step, num_steps=self.num_steps, loss=loss_value, steps_per_s=1.0 / step_time_s,
            step_time_s=step_time_s, own_step_time_s=own_step_time_s))
        values.update(learning_rate=self.learning_rate, step_time_s=step_time_s,
                      examples_per_s=self.global_batch_size / step_time_s)
        if self.gather:
            gathered = gather_process_values(own_step_time_s)
            self._in_jax_s += self.clock() - synced  # waits for every peer: not own time
            for process_id, own in enumerate(gathered):
                values[process_tag(process_id)] = float(own)
        else:
            values[process_tag(self.process_id)] = own_step_time_s
        if self.compile_time_s is not None:
            values["compile_time_s"] = self.compile_time_s
            self.compile_time_s = None  # once, at the first log step
        finite = math.isfinite(loss_value)
        if step == self.num_steps:
            values["final_loss"] = loss_value
        self.tracker.scalars(step, values)
        if step == self.num_steps:
            self.tracker.hparams(self.hparams, {"final_loss": loss_value})
        if not finite:
            message = f"loss is {loss_value} at step {step}"
            if self.on_nonfinite == "stop":
                error = FloatingPointError(
                    f"{message} (logging.on_nonfinite_loss: stop; set it to warn to keep going)")
                error.step = step
                raise error
            self.out(f"warning: {message}; continuing (logging.on_nonfinite_loss: warn)")
        return values


def gather_process_values(value: float):
    """Every process's ``value``, on every process, with one JAX collective.

    Must be called by all processes at the same point (it is a collective).

    Args:
      value: a host scalar (seconds, here).

    Returns:
      ``[num_processes]`` float32 numpy array, indexed by process_id.
    """
    import numpy as np
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(np.float32(value))).reshape(-1)
