"""The loop's device calls: how many optimizer steps each runs (``train.steps_per_call``,
``auto`` resolved), how each is dispatched (``compiled_at_first_call``) and how far the host
may run ahead of the devices (``InFlight``, ``in_flight``).

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
  (``math.gcd``) under that cap; log steps may fall inside a call (``worker.trainer.train``
  computes their metrics there).

On CPU devices (single-host debug mode) ``auto`` is 1: every step its own call, as a
debugger or a stack dump expects. A number in the spec is used as given.
"""

from __future__ import annotations

import collections
import math
import time
from typing import Any, Callable, Sequence

MAX_STEPS_PER_CALL = 1000
# dispatched calls may wait this long in the devices' queue on TPU and GPU (worker.trainer.calls.InFlight)
QUEUE_S = 0.1
MAX_CALLS_IN_FLIGHT = 1000
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


def steps_per_call(setting: int | str, platform: str, call_ends: Sequence[int],
                   bytes_per_step: int) -> int:
    """``train.steps_per_call`` as the loop runs it.

    Args:
      setting: the spec's value, a number >= 1 or ``"auto"``.
      platform: the devices' platform (``jax.devices()[0].platform``: cpu, tpu, gpu).
      call_ends: steps at whose multiples a call must end: a resumed run's step (0 for a new
        run) and every period that ends a call (``worker.contract.periods.ENDS_A_CALL``: the
        run's last step, ``checkpoint.every_steps``; 0 stands for none).
      bytes_per_step: ``step_bytes``'s estimate.

    Returns:
      A number of steps >= 1; for ``auto`` a divisor of every one of ``call_ends``, at most
      ``MAX_STEPS_PER_CALL``.
    """
    if setting != "auto":
        return int(setting)
    if platform == "cpu":
        return 1
    estimate_s = STEP_OVERHEAD_S + bytes_per_step / ASSUMED_BYTES_PER_S
    cap = max(1, min(MAX_STEPS_PER_CALL, int(CALL_TARGET_S / estimate_s)))
    boundaries = math.gcd(*call_ends)
    if boundaries == 0:  # no call end asked for: the cap
        return cap
    return next(k for k in range(min(cap, boundaries), 0, -1) if boundaries % k == 0)


def metrics_every(steps_per_call: int, *row_periods: int) -> int:
    """Steps between the rows of metrics a call returns: every step of a period that is a
    row (``worker.contract.periods.A_ROW``: the log steps) is a row's step (call boundaries
    are multiples of ``steps_per_call``, each period's steps of it, so all are multiples of
    their gcd), and no more rows than that."""
    return math.gcd(steps_per_call, *row_periods)


def in_flight(platform: str) -> tuple[int, float | None]:
    """``(max_calls, queue_s)`` of the loop's ``worker.trainer.calls.InFlight`` on ``platform``'s devices:
    on CPU 2 calls (more deadlock there: ``InFlight``); on TPU and GPU up to
    ``MAX_CALLS_IN_FLIGHT`` calls, none queued longer than ``QUEUE_S`` seconds."""
    return (2, None) if platform == "cpu" else (MAX_CALLS_IN_FLIGHT, QUEUE_S)


def read_every_s(platform: str) -> float:
    """Seconds between the loop's reads of finished log steps (``worker.telemetry.metrics``'s
    ``read_every_s``) on ``platform``'s devices: 0.25 on CPU; on TPU and GPU a quarter of
    ``QUEUE_S``, so that a read (its progress lines, TensorBoard scalars and metrics.jsonl,
    about 0.1 ms a log step on a TPU v5e's host) ends long before the calls queued ahead of
    the chip run out: read every 0.25 s, 1,000 log steps of the 256 x 4 job held the host
    for 0.12 s, and the chip waited (docs/tpu.md)."""
    return 0.25 if platform == "cpu" else QUEUE_S / 4


def compiled_at_first_call(mapped: Callable) -> Callable:
    """``mapped`` (a ``jax.pmap`` or ``jax.jit`` function) lowered and compiled ahead of time
    at its first call (``mapped.lower(*args).compile()``, JAX's AOT API; the persistent
    compilation cache serves it as it would the call), then called as that executable.

    The step is called with the same shapes, dtypes and shardings every time, so what
    ``pmap`` works out again on every call (the mesh, the shardings, the argument checks:
    about 250 us a call on CPU in jax 0.9, more than the step of a small model; on a TPU v5e
    227 us against the executable's 182, ``bench/dispatch_costs.py``, docs/tpu.md) is done
    once. With several processes ``pmap.lower`` reads each process's arrays as the global
    ones and fails, so ``worker.trainer.train.make_train_step`` leaves a multi-process pmap as it is;
    the jit step takes global arrays and is compiled so everywhere. Results, donation and
    errors are the function's own. A call whose arguments differ from the first's in shape,
    dtype or sharding, or in their tree (the executable refuses them with a TypeError before
    running anything, so nothing is donated), falls back to ``mapped`` itself: compiled for
    them, or refused with its own error.
    """
    compiled: list = []

    def call(*args):
        if not compiled:
            compiled.append(mapped.lower(*args).compile())
        try:
            return compiled[0](*args)
        except TypeError:  # refused before it ran: ``mapped`` compiles for these, or says why
            return mapped(*args)

    return call


class InFlight:
    """Bounds how far the host's dispatches run ahead of the devices.

    JAX dispatches asynchronously: without a sync, the host enqueues calls
    as fast as it can. With several CPU devices per process, executions of
    different calls then interleave on XLA's thread pool, and a device blocked
    in call s's cross-process all-reduce (gloo) can wait forever for a peer
    device busy with call s+1: seen as a deadlock after step 1 with 2 processes
    x 2 devices and 50 steps between logs, every time. So on CPU devices
    ``max_calls`` is 2 (``worker.trainer.calls.in_flight``): waiting for call s - 1
    before dispatching call s + 1 keeps the devices fed without a sync on the
    call just dispatched.

    On a chip the queue is the host's slack: while the host reads a batch of log
    steps, hands a local copy over or collects garbage, the chip works through
    what is queued. Two calls of a fused 256 x 4 step are 5 ms of work, and a
    read of a quarter second's log steps took 60 ms on the v5e's host, so the
    chip idled (docs/tpu.md). There the bound is ``queue_s`` seconds of age: a
    call dispatched longer ago than that and not known finished is waited for
    (so the host runs at most about ``queue_s`` ahead: a stop, a progress line,
    a notice wait no longer than that for the call in flight), and at most
    ``max_calls`` calls are queued.

    ``finished_step``: the last step of the newest call known to have finished
    (waited for here); its outputs, and those of every call before it, can be
    read without waiting (``worker.telemetry.metrics`` reads log steps then).

    Args:
      max_calls: calls queued at most (>= 1).
      queue_s: seconds a call may wait in the queue before the host waits for it
        (None: no age bound, only ``max_calls``).
      clock: seconds, monotonic.
      finished_step: the step the run starts after (a resumed run's checkpoint step).
    """

    def __init__(self, max_calls: int = 2, queue_s: float | None = None,
                 clock: Callable[[], float] = time.perf_counter, finished_step: int = 0):
        self.max_calls, self.queue_s, self.clock = max_calls, queue_s, clock
        self.finished_step = finished_step
        self._pending: collections.deque = collections.deque()  # (output, last step, when)

    def add(self, output: Any, step: int | None = None) -> None:
        """Record a dispatched call's ``output`` (its last step ``step``); wait for the oldest
        calls beyond the bounds."""
        now = self.clock()
        self._pending.append((output, step, now))
        while len(self._pending) > self.max_calls or (
                self.queue_s is not None and len(self._pending) > 2
                and now - self._pending[0][2] > self.queue_s):
            oldest, done, _ = self._pending.popleft()
            import jax

            jax.block_until_ready(oldest)
            if done is not None:
                self.finished_step = done
