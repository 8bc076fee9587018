"""The train step as ``jax.jit`` over a global mesh (``train.parallelism: jit``).

The same step as ``worker.trainer.train``'s ``pmap`` (``worker.trainer.train.step_function``),
written the way JAX recommends now that ``pmap`` is in maintenance mode
(JAX docs, "Distributed arrays and automatic parallelization" and "Migrating
to the new jax.pmap"): one ``jax.jit`` over a 1-D ``jax.sharding.Mesh`` of
every device of every process, the batch sharded along its leading axis with
``NamedSharding(mesh, P("batch"))``, params and optimizer state replicated
(``P()``). The step itself is ``worker.trainer.train``'s, run per device under
``vmap`` inside the ``jit`` (``make_train_step``), so both paths do the
same arithmetic and ``train.allreduce`` applies to both.

Each process still loads only its own rows (``worker.data.batches``) and turns them
into global arrays with ``jax.make_array_from_process_local_data``. The mesh
orders devices by process, then id, so process p's rows are global rows
``[p * B / P, (p + 1) * B / P)`` of each batch, exactly as ``worker.data.batches``
assigns them.

The functions mirror ``worker.trainer.train``'s (``make_train_step``, ``replicate``,
``placer``, ``unreplicate``), so the loop in ``worker.trainer.loop`` takes either module.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from worker.trainer.calls import StepCalls
from worker.trainer.train import averaging, flat_state, step_function

AXIS = "batch"  # the mesh's one axis: data parallelism over every device


@functools.cache
def mesh() -> Mesh:
    """Every device of the job on one axis, ``[device_count]``, grouped by process."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(np.array(devices), (AXIS,))


def replicated() -> NamedSharding:
    """A full copy on every device (params, optimizer state, scalars)."""
    return NamedSharding(mesh(), PartitionSpec())


def batch_sharded(axis: int = 0) -> NamedSharding:
    """Split along ``axis`` over every device (``axis`` 1 for a stack of batches)."""
    return NamedSharding(mesh(), PartitionSpec(*([None] * axis), AXIS))


def make_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, state: Any,
                    steps_per_call: int = 1, allreduce: str = "packed",
                    metrics_fn: Callable | None = None,
                    metrics_every: int | None = None, unroll: int = 1,
                    donate: bool = True, constants: tuple | None = None) -> StepCalls:
    """Build the jitted calls of the step; arguments and results as
    ``worker.trainer.train.make_train_step``'s, with global arrays in place of per-device stacks.

    Inside the ``jit``, each batch's rows are split into ``[device_count,
    per_device_batch_size]`` (the split falls on the sharding, so no data
    moves) and ``worker.trainer.train``'s own per-device step runs under
    ``jax.vmap(..., axis_name=AXIS)`` over that axis: its ``pmean`` becomes a
    reduction over the sharded axis, which XLA's SPMD partitioner turns into
    one all-reduce (one per dtype with ``packed``, as under ``pmap``). So the
    arithmetic is pmap's, and params and optimizer state stay replicated
    global arrays, unbatched (``out_axes=None``: values after a ``pmean`` are
    equal on every device).

    Args:
      loss_fn, optimizer, state, steps_per_call, allreduce, metrics_fn, metrics_every,
        unroll, donate: as ``worker.trainer.train.make_train_step``.
      constants: the inputs of every call (``placer``'s arrays, below), made part of the
        program: a resident batch that never changes (``worker.trainer.calls.constant_batch``).
        XLA then works on the data at compile time as a hand-written loop closing over its
        batch lets it (on a TPU v5e, a transposed copy of a 65,536 x 256 batch for the
        backward's product: 5,311 steps/s against 4,582 with the batch an argument,
        docs/tpu.md). The calls then take the state alone and ignore the inputs given.

    Args (of a call, k = 1), global arrays:
      state: the leaves of the replicated ``(params, opt_state)`` (``replicate``), donated.
      batch: dict of arrays ``[global_batch_size, ...]``, batch-sharded (``placer(1)``).

    Args (k > 1): ``(state, window, first)``: window a dict of arrays
      ``[W, global_batch_size, ...]`` sharded along axis 1 (``placer(k)``);
      ``first`` a replicated int32 scalar.

    Returns (of a call): the new state (replicated) and, for a ``rows`` call, this
      process's first device's copy of the metrics, ``[1, 3 + M]`` float32
      (``[1, R, 3 + M]`` for k > 1, R = k / metrics_every; columns
      ``worker.contract.metrics.STEP_METRICS`` then ``metrics_fn``'s): the layout ``pmap``
      gives with one local device, so ``worker.telemetry.metrics`` reads either with one
      transfer (a global array spanning other processes cannot be fetched).

    Raises:
      ValueError: ``allreduce`` is neither ``per_leaf`` nor ``packed``.
    """
    devices = mesh().size
    average = averaging(allreduce, devices)
    treedef = jax.tree_util.tree_structure(state)
    rows = 0 if steps_per_call == 1 else 1  # the batch rows' axis (1: after the window's)

    def split(a):
        return a.reshape(a.shape[:rows] + (devices, -1) + a.shape[rows + 1:])

    def jitted(with_metrics: bool) -> Callable:
        per_device = step_function(loss_fn, optimizer, average, with_metrics, steps_per_call,
                                   metrics_fn, metrics_every, unroll)

        def step(params, opt_state, batch, *first):
            outputs = jax.vmap(per_device, in_axes=(None, None, rows) + (None,) * len(first),
                               out_axes=None, axis_name=AXIS)(
                params, opt_state, jax.tree.map(split, batch), *first)
            return (*outputs[:2], outputs[2][None]) if with_metrics else outputs

        call = flat_state(step, treedef)
        if constants is not None:
            with_inputs = call

            def call(state):  # noqa: F811  the inputs closed over: constants of the program
                return with_inputs(state, *constants)

        return jax.jit(call, out_shardings=replicated(), donate_argnums=(0,) if donate else ())

    # a global array spanning other processes cannot be read whole: this process's first
    # copy; in one process the array itself (taking the copy cost a log step's call 7-10 us
    # on one CPU device: 41-44 against 34)
    return StepCalls(treedef, jitted(True), jitted(False), baked=constants is not None,
                     local_rows=(lambda metrics: metrics.addressable_data(0))
                     if jax.process_count() > 1 else None)


def _global(local: np.ndarray, sharding: NamedSharding, axis: int) -> jax.Array:
    """This process's rows along ``axis`` as its part of the global array."""
    shape = list(local.shape)
    shape[axis] *= jax.process_count()
    return jax.make_array_from_process_local_data(sharding, local, tuple(shape))


def placer(steps_per_call: int = 1) -> Callable[[Any], Any]:
    """The function ``worker.data.batches.Batches`` puts this process's batches on the devices with.

    The returned ``place(tree)`` takes ``worker.data.batches``'s (pmap) layout and returns
    global arrays:
      - a batch (k = 1): dict of ``[local_device_count, per_device_batch_size, ...]``
        -> ``[global_batch_size, ...]``, batch-sharded;
      - a window (k > 1): dict of ``[local_device_count, W, per_device_batch_size, ...]``
        -> ``[W, global_batch_size, ...]``, sharded along axis 1;
      - a call's first index: ``[local_device_count]`` int32 (equal entries) -> a
        replicated int32 scalar.
    The mesh orders devices by process, then id, so this process's rows are its
    contiguous block of each global batch, as ``worker.data.order`` assigns them.
    """
    def rows_of_batch(a: np.ndarray) -> jax.Array:
        return _global(np.ascontiguousarray(a).reshape(-1, *a.shape[2:]), batch_sharded(0), 0)

    def rows_of_window(a: np.ndarray) -> jax.Array:
        stacked = np.ascontiguousarray(np.swapaxes(a, 0, 1))  # [W, local_device_count, per, ...]
        return _global(stacked.reshape(stacked.shape[0], -1, *stacked.shape[3:]),
                       batch_sharded(1), 1)

    def place(tree: Any) -> Any:
        if isinstance(tree, np.ndarray) and tree.ndim == 1:  # a call's first index
            return jax.make_array_from_process_local_data(replicated(), np.int32(tree[0]), ())
        return jax.tree.map(rows_of_batch if steps_per_call == 1 else rows_of_window, tree)

    return place


def replicate(tree: Any) -> Any:
    """Every leaf as a replicated global array (the same value on every process)."""
    return jax.tree.map(lambda a: jax.make_array_from_process_local_data(
        replicated(), np.asarray(a), np.shape(a)), tree)


def unreplicate(tree: Any) -> Any:
    """This process's first copy of every replicated leaf, as numpy."""
    return jax.tree.map(lambda a: np.asarray(a.addressable_data(0)), tree)
