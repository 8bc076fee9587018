"""What a worker measures and logs at log steps: timing, norms, the per-process gather.

The training loop stays a few lines; everything it reports goes through one
``StepLogger``:

* ``timed(step_fn)`` wraps the pmapped step to time its first call (trace +
  compile + dispatch, so ``compile_time_s`` needs no device sync), to count
  steps, and to sum the time spent inside the calls. Per step that is two
  clock reads and no device sync.
* ``log(step, loss, norms)`` runs at log steps only. It reads the clock when
  this process arrives, fetches loss and norms in one ``device_get`` (the one
  device sync), prints the progress line, and, when TensorBoard is on,
  gathers every process's own step time to process 0 with one JAX collective
  (``multihost_utils.process_allgather``).

Two step times (seconds per step since the previous log step):

* ``step_time_s``: wall time. In a synchronous data-parallel run every process
  waits for the slowest one inside the collectives, so this is the same on
  every process: it says how fast the run goes, not who holds it back.
* ``own_step_time_s``: the wall time minus the time this process spent inside
  JAX (the step calls, where a process blocks when its peers are behind, and
  the log step's sync): its own host work per step (input, Python, a task's
  hooks). A straggling host (slow input, a busy CPU) has the largest. Time
  blocked in a step call is left out because it mixes a process's own dispatch
  with waiting for peers (the first steps wait for the slowest compilation);
  so a device that computes slowly is not singled out here, it shows in
  everyone's ``step_time_s``.
"""

from __future__ import annotations

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
    """

    def __init__(self, job: dict, process_id: int, num_processes: int, tracker, out=print,
                 clock: Callable[[], float] = time.perf_counter):
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
        self.tracker, self.out, self.clock = tracker, out, clock
        self.hparams = flatten({k: v for k, v in job.items() if k != "cluster"})
        self.compile_time_s: float | None = None
        self.last_loss: float | None = None
        self._calls = 0
        self._mark: float | None = None   # clock after the previous sync (or the first dispatch)
        self._mark_calls = 0
        self._in_jax_s = 0.0               # time inside step calls since the mark
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
                # The first step ran after its dispatch returned: count it in the interval.
                self._mark, self._mark_calls = end, self._calls
            else:
                self._in_jax_s += end - start
            self._calls += 1
            return result
        return counted

    def is_log_step(self, step: int) -> bool:
        """Log steps: every ``log_every_steps``-th step, and the last one."""
        return step % self.log_every == 0 or step == self.num_steps

    def log(self, step: int, loss, norms: dict) -> dict:
        """At a log step: sync once, print progress, gather, write scalars, check the loss.

        Args:
          step: the step just dispatched (counts from 1).
          loss: ``[local_device_count]`` float32 device array (equal on every device).
          norms: ``{"grad_norm", "param_norm"}``, each ``[local_device_count]`` float32.

        Returns:
          The scalars written (tag -> float), also for non-zero processes.

        Raises:
          FloatingPointError: the loss is NaN or infinite and
            ``logging.on_nonfinite_loss`` is ``stop``; the message names the step.
        """
        import jax

        arrived = self.clock()
        fetched = jax.device_get({"loss": loss, **norms})  # the one device sync of a log step
        synced = self.clock()
        steps = max(1, self._calls - self._mark_calls)
        step_time_s = (synced - self._mark) / steps
        own_step_time_s = max(0.0, arrived - self._mark - self._in_jax_s) / steps
        self._mark, self._mark_calls, self._in_jax_s = synced, self._calls, 0.0

        values = {name: float(value[0]) for name, value in fetched.items()}
        loss_value = values["loss"]
        self.last_loss = loss_value
        self.out(contract.PROGRESS_FORMAT.format(
            step=step, num_steps=self.num_steps, loss=loss_value, steps_per_s=1.0 / step_time_s,
            step_time_s=step_time_s, own_step_time_s=own_step_time_s))
        values.update(learning_rate=self.learning_rate, step_time_s=step_time_s,
                      examples_per_s=self.global_batch_size / step_time_s)
        if self.gather:
            for process_id, own in enumerate(gather_process_values(own_step_time_s)):
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
                raise FloatingPointError(
                    f"{message} (logging.on_nonfinite_loss: stop; set it to warn to keep going)")
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
