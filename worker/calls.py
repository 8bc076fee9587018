"""How many optimizer steps one device call runs (``train.steps_per_call``), ``auto`` resolved.

A small step on an accelerator is bound by its dispatch, not by the chip: on a TPU v5e
(docs/tpu.md) the linear job's 256 x 4 step runs about 5,000 times a second one call per
step, and 380,000 times a second 1,000 to a call. So ``auto`` fuses steps on TPU and GPU
devices, as many as keep one call short:

* the call is estimated at ``STEP_OVERHEAD_S`` plus the bytes a step reads and writes
  (this process's batch and three times the params: read, gradient, write) at
  ``ASSUMED_BYTES_PER_S``, a tenth of a v5e chip's HBM bandwidth (819 GB/s), so that
  compute-heavy steps are overestimated rather than under; steps are fused until a call
  is estimated at ``CALL_TARGET_S`` (a notice, a heartbeat, a stop or a progress line
  waits for the call in flight), and never more than ``MAX_STEPS_PER_CALL``;
* call boundaries must fall on the last step, on every checkpoint step and on the step a
  resumed run starts after, so the count is the largest divisor of all three
  (``math.gcd``) under that cap; log steps may fall inside a call (``worker.train``
  computes their metrics there).

On CPU devices (single-host debug mode) ``auto`` is 1: every step its own call, as a
debugger or a stack dump expects. A number in the spec is used as given.
"""

from __future__ import annotations

import math
from typing import Any

MAX_STEPS_PER_CALL = 1000
CALL_TARGET_S = 0.1
ASSUMED_BYTES_PER_S = 80e9
STEP_OVERHEAD_S = 5e-6


def step_bytes(batch: dict, params: Any) -> int:
    """Bytes one step of this process reads and writes, estimated: the batch's arrays (numpy,
    this process's rows of one step) plus three times the params' (a pytree of arrays)."""
    import jax
    import numpy as np

    return (sum(int(np.asarray(a).nbytes) for a in batch.values())
            + 3 * sum(int(np.asarray(leaf).nbytes) for leaf in jax.tree_util.tree_leaves(params)))


def steps_per_call(setting: int | str, platform: str, num_steps: int, steps_done: int,
                   checkpoint_every_steps: int, bytes_per_step: int) -> int:
    """``train.steps_per_call`` as the loop runs it.

    Args:
      setting: the spec's value, a number >= 1 or ``"auto"``.
      platform: the devices' platform (``jax.devices()[0].platform``: cpu, tpu, gpu).
      num_steps: the run's last step.
      steps_done: steps already done (a resumed run's checkpoint step; 0 for a new run).
      checkpoint_every_steps: ``checkpoint.every_steps`` (0: no periodic checkpoints).
      bytes_per_step: ``step_bytes``'s estimate.

    Returns:
      A number of steps >= 1; for ``auto`` a divisor of ``num_steps``, ``steps_done`` and
      ``checkpoint_every_steps`` (where not 0), at most ``MAX_STEPS_PER_CALL``.
    """
    if setting != "auto":
        return int(setting)
    if platform == "cpu":
        return 1
    estimate_s = STEP_OVERHEAD_S + bytes_per_step / ASSUMED_BYTES_PER_S
    cap = max(1, min(MAX_STEPS_PER_CALL, int(CALL_TARGET_S / estimate_s)))
    boundaries = math.gcd(num_steps, steps_done, checkpoint_every_steps)
    return next(k for k in range(min(cap, boundaries), 0, -1) if boundaries % k == 0)


def metrics_every(steps_per_call: int, log_every_steps: int) -> int:
    """Steps between the rows of metrics a call returns: every log step is a row's step
    (call boundaries are multiples of ``steps_per_call``, log steps of ``log_every_steps``,
    so both are multiples of their gcd), and no more rows than that."""
    return math.gcd(steps_per_call, log_every_steps)
