"""The loop's device calls: how many optimizer steps each runs (``train.steps_per_call``,
``auto`` resolved), how each is dispatched (``StepCalls``) and how far the host may run ahead
of the devices (``InFlight``, ``in_flight``).

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
UNROLL = 10  # steps per turn of a fused call's device loop (``unroll``)
DONATE_ABOVE_BYTES = 16 << 20  # a state donated above this size on TPU and GPU (``donate``)
UNDONATED_MIN_STEPS = 500  # and in calls shorter than this
CONSTANT_MAX_BYTES = 256 << 20  # a resident batch made a constant up to this size (``constant_batch``)


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


def unroll(steps_per_call: int) -> int:
    """Steps per turn of a fused call's device loop (``worker.trainer.train.step_function``):
    ``UNROLL``, or fewer in a shorter call. A turn of an XLA ``while`` loop costs a tiny step
    as much as the step itself: on a TPU v5e the 256 x 4 step ran 421k steps/s a turn at a
    time and 849k ten to a turn, 1,000 steps a call; the 65,536 x 256 step with its batch a
    constant 5,351 against 9,257 (bench/step_account.py, docs/tpu.md). The steps and their
    order are the same; the program holds ``UNROLL`` copies of the step (compilation time)."""
    return max(1, min(UNROLL, steps_per_call))


def donate(platform: str, state_bytes: int, steps_per_call: int = 1) -> bool:
    """Whether a call donates its state (its buffers reused for the new state).

    On CPU devices, for a state over ``DONATE_ABOVE_BYTES`` (where a second copy during a
    call costs device memory a model needs) and for calls of fewer than
    ``UNDONATED_MIN_STEPS`` steps, yes. Else (a small state, long calls, a TPU or GPU) no: on
    a TPU v5e a donated carry moved between memory spaces on every turn of the device loop,
    a state not donated is copied in and out once a call instead, which pays off over long
    calls only: the 256 x 4 step, ten steps a turn, ran 828k steps/s donated and 915k not at
    1,000 steps a call, but 581k donated and 512k not at 100 (bench/step_account.py,
    docs/tpu.md)."""
    return (platform == "cpu" or state_bytes > DONATE_ABOVE_BYTES
            or steps_per_call < UNDONATED_MIN_STEPS)


def constant_batch(platform: str, num_processes: int, local_device_count: int,
                   resident: bool, num_batches: int, batch_bytes: int) -> bool:
    """Whether the calls take the run's one batch as a constant of their program
    (``worker.trainer.sharded.make_train_step``'s ``constants``): one batch that never changes
    (resident and alone: every step reads the same rows), one device in one process (the
    whole job's batch is this device's), on a TPU or GPU (on CPU devices the trace and the
    debugger see the batch as an argument, as written), and at most ``CONSTANT_MAX_BYTES``
    (the executable and the compilation cache hold it). XLA then prepares the data at
    compile time for the step that reads it: on a TPU v5e the 65,536 x 256 job ran 4,582
    steps/s with its batch an argument and 5,311 with it a constant (a transposed copy of
    the batch for the backward's product, folded at compile time: docs/tpu.md)."""
    return (platform != "cpu" and num_processes == 1 and local_device_count == 1 and resident
            and num_batches == 1 and batch_bytes <= CONSTANT_MAX_BYTES)


def metrics_every(steps_per_call: int, *row_periods: int) -> int:
    """Steps between the rows of metrics a call returns: every step of a period that is a
    row (``worker.contract.periods.A_ROW``: the log steps) is a row's step (call boundaries
    are multiples of ``steps_per_call``, each period's steps of it, so all are multiples of
    their gcd), and no more rows than that."""
    return math.gcd(steps_per_call, *row_periods)


def in_flight(platform: str, local_device_count: int = 1) -> tuple[int, float | None]:
    """``(max_calls, queue_s)`` of the loop's ``worker.trainer.calls.InFlight`` on ``platform``'s devices:
    with several CPU devices in the process 2 calls (more deadlock there: ``InFlight``); on
    TPU and GPU, and on one CPU device (whose calls run one after the other, each taking the
    state of the one before: nothing to interleave), up to ``MAX_CALLS_IN_FLIGHT`` calls, none
    queued longer than ``QUEUE_S`` seconds."""
    if platform == "cpu" and local_device_count > 1:
        return 2, None
    return MAX_CALLS_IN_FLIGHT, QUEUE_S


def read_every_s(platform: str) -> float:
    """Seconds between the loop's reads of finished log steps (``worker.telemetry.metrics``'s
    ``read_every_s``) on ``platform``'s devices: 0.25 on CPU; on TPU and GPU a quarter of
    ``QUEUE_S``, so that a read (its progress lines, TensorBoard scalars and metrics.jsonl,
    about 0.1 ms a log step on a TPU v5e's host) ends long before the calls queued ahead of
    the chip run out: read every 0.25 s, 1,000 log steps of the 256 x 4 job held the host
    for 0.12 s, and the chip waited (docs/tpu.md)."""
    return 0.25 if platform == "cpu" else QUEUE_S / 4


class StepCalls:
    """The loop's device calls over the training state as one flat list of arrays.

    A call takes ``(state, *inputs)``: ``state`` the leaves of ``(params, opt_state)`` in
    ``treedef``'s order (donated), ``inputs`` the call's batches (``worker.data.batches``).
    Two executables of the same steps: ``rows`` also returns the call's rows of metrics (a
    call with a log step), ``bare`` returns the state alone. A list of leaves in and out, no
    loss beside the metrics (its column 0), no metrics at calls nobody reads: each result
    the host receives is a buffer and a Python object on every call, and each custom pytree
    node one more to unflatten. On one CPU device (the 256 x 4 step,
    ``bench/step_limit.py``'s hand-written loop at 80-90k steps/s), the trainer's call with
    params and optimizer state as two trees, a loss and metrics ran 33-41k calls/s, the
    same step as a list of leaves in and out 80-89k (docs/benchmarks.md).

    ``ahead``: both executables are compiled before the first call runs (JAX's AOT API,
    ``lower(*args).compile()``; the persistent compilation cache serves it as it would the
    call), so the first call's time holds every compilation the loop does. ``pmap`` is then
    called as its executables (what ``pmap`` works out again on every call, about 250 us on
    CPU in jax 0.9 and 227 us against the executable's 182 on a TPU v5e, is done once:
    ``bench/dispatch_costs.py``, docs/tpu.md), ``jit`` as itself (its C++ path, warmed by the
    compilation, is faster than an executable's Python call: 85-89k against 76-78k calls/s).
    A call the executable refuses (other shapes, dtypes, shardings or tree: a TypeError
    before anything runs, nothing donated) falls back to the mapped function. With several
    processes ``pmap.lower`` reads each process's arrays as the global ones and fails: there
    ``bare`` is None and every call is ``rows``, compiled at its first call (as before).

    Args:
      treedef: ``(params, opt_state)``'s tree structure.
      rows: ``(state, *inputs) -> (state, metrics)``, a ``jax.pmap`` or ``jax.jit`` function.
      bare: ``(state, *inputs) -> state``, or None (every call is ``rows``).
      run_compiled: call ``pmap``'s compiled executables (True) or the jitted functions.
      local_rows: this process's part of ``rows``' metrics (``jit``: ``addressable_data(0)``).
      baked: ``rows`` and ``bare`` take the state alone, their inputs constants of the
        program (``worker.trainer.sharded.make_train_step``'s ``constants``): the inputs a
        call is given are not passed on.
    """

    def __init__(self, treedef: Any, rows: Callable, bare: Callable | None = None,
                 run_compiled: bool = False,
                 local_rows: Callable[[Any], Any] | None = None, baked: bool = False):
        self.treedef, self.local_rows, self.run_compiled = treedef, local_rows, run_compiled
        if baked:
            rows, bare = _inputs_dropped(rows), bare and _inputs_dropped(bare)
        self.baked = baked
        self._mapped = {True: rows, False: bare}
        self._call = dict(self._mapped)
        self.compiled = bare is None  # nothing to compile ahead without a bare call

    @property
    def bare(self) -> Callable | None:
        """The bare call as the loop may call it directly, ``(state, *inputs) -> state``, once
        a first call has compiled it (None before, and where there is none)."""
        return self._call[False] if self.compiled else None

    @property
    def has_bare(self) -> bool:
        """Whether there is a bare call (none where every call is ``rows``: several processes'
        pmap), compiled or not yet."""
        return self._mapped[False] is not None

    @property
    def rows(self) -> Callable | None:
        """The rows call as the loop may call it directly, ``(state, *inputs) -> (state,
        metrics)`` with this process's metrics (``local_rows``), once a first call has compiled
        it; None before, and where there is no bare call (then the loop's own dispatch makes
        every call)."""
        return self._rows if self.compiled and self.has_bare else None

    def flatten(self, params: Any, opt_state: Any) -> list:
        """The state a call takes: the leaves of ``(params, opt_state)``."""
        return self.treedef.flatten_up_to((params, opt_state))

    def unflatten(self, state: list) -> tuple:
        """``(params, opt_state)`` of a call's state."""
        return self.treedef.unflatten(state)

    def __call__(self, state: list, inputs: tuple, rows: bool) -> tuple:
        """Dispatch one call: ``(state, metrics)``, metrics None for a bare call (``rows``
        False, where ``bare`` exists)."""
        if not self.compiled:
            self._compile(state, inputs)
        if not rows and self._call[False] is None:
            rows = True
        try:
            out = self._call[rows](state, *inputs)
        except TypeError:
            if self._call[rows] is self._mapped[rows]:
                raise
            out = self._mapped[rows](state, *inputs)  # refused before it ran: compiled for these
        if not rows:
            return out, None
        return out[0], self._local(out[1])

    def _compile(self, state: list, inputs: tuple) -> None:
        for rows, mapped in self._mapped.items():
            compiled = mapped.lower(state, *inputs).compile()
            if self.run_compiled:
                self._call[rows] = compiled
        self.compiled = True

    def _rows(self, state: list, *inputs) -> tuple:
        state, metrics = self._call[True](state, *inputs)
        return state, self._local(metrics)

    def _local(self, metrics):
        return self.local_rows(metrics) if self.local_rows else metrics


class _inputs_dropped:
    """A function of the state alone called as ``(state, *inputs)``: the inputs are constants
    of its program (``StepCalls``' ``baked``). ``lower`` as the function's."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, state, *inputs):
        return self.fn(state)

    def lower(self, state, *inputs):
        return self.fn.lower(state)


class InFlight:
    """Bounds how far the host's dispatches run ahead of the devices.

    JAX dispatches asynchronously: without a sync, the host enqueues calls
    as fast as it can. With several CPU devices per process, executions of
    different calls then interleave on XLA's thread pool, and a device blocked
    in call s's cross-process all-reduce (gloo) can wait forever for a peer
    device busy with call s+1: seen as a deadlock after step 1 with 2 processes
    x 2 devices and 50 steps between logs, every time (and in one process of two
    CPU devices, in XLA's in-process all-reduce). So with several CPU devices in
    the process ``max_calls`` is 2 (``worker.trainer.calls.in_flight``): waiting for call s - 1
    before dispatching call s + 1 keeps the devices fed without a sync on the
    call just dispatched.

    On a chip (and on one CPU device) the queue is the host's slack: while the host reads a batch of log
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
        self._pending: collections.deque = collections.deque()  # [output, last step, when, own, calls]
        self._calls = 0  # calls in _pending
        self._measured: tuple | None = None  # (clock, finished step) at the last wait
        self.steps_per_s: float | None = None  # the devices' rate, measured by the waits

    def add(self, output: Any, step: int | None = None, own: bool = True, calls: int = 1,
            since: float | None = None) -> None:
        """Record a dispatched call (its last step ``step``); wait for the oldest calls beyond
        the bounds.

        Args:
          output: what to wait on for the call: one of its results (``own``), or, for a
            call that returns only the state the next call takes (a bare call,
            ``StepCalls``), that state (``own`` False): it can be waited on only until the
            next call is added, which has it donated. A call left with nothing to wait on is
            waited for through the first later call that has something: calls finish in
            order, each taking the state of the one before, so the wait drains the queue
            down to that call.
          calls, since: a run of ``calls`` calls recorded as one, the first dispatched at
            clock ``since`` (the loop's quiet calls: ``per_call`` False), ``step`` the last's.
        """
        now = self.clock()
        if self._measured is None:  # the rate's first interval starts at the first call
            self._measured = (now if since is None else since, self.finished_step)
        pending = self._pending
        if pending and not pending[-1][3]:
            pending[-1][0] = None  # donated to this call
        pending.append([output, step, now if since is None else since, own, calls])
        self._calls += calls
        while self._calls > self.max_calls or (
                self.queue_s is not None and len(pending) > 2
                and now - pending[0][2] > self.queue_s):
            waited = next(i for i, entry in enumerate(pending) if entry[0] is not None)
            import jax

            jax.block_until_ready(pending[waited][0])
            for _ in range(waited + 1):
                _, done, _, _, calls = pending.popleft()
                self._calls -= calls
                if done is not None:
                    self.finished_step = done
            self._measure(self.finished_step)  # once a wait: the calls it found finished

    def _measure(self, done: int) -> None:
        """The devices' steps per second, from the steps found finished between two waits
        (a wait ends when its call has run)."""
        now = self.clock()
        if self._measured is not None and now > self._measured[0] and done > self._measured[1]:
            self.steps_per_s = (done - self._measured[1]) / (now - self._measured[0])
        self._measured = (now, done)

    def ahead_calls(self, steps_per_call: int) -> int:
        """Calls the loop may dispatch as one run before it adds them (``add``'s ``calls``):
        those the devices run in ``queue_s`` at the rate last measured, at least 1 (1 until
        it is measured: each call then meets the bounds as it is added). So a run of quiet
        calls holds the host no further ahead of slow steps than the bounds do."""
        if self.steps_per_s is None or self.queue_s is None:
            return 1
        return max(1, int(self.steps_per_s * self.queue_s) // steps_per_call)

    @property
    def per_call(self) -> bool:
        """Whether every call must be added as it is dispatched: the bound is a few calls
        (several CPU devices in the process), not the age of a queue."""
        return self.queue_s is None
