"""The distributed train step: the seed's pmap + value_and_grad + pmean.

This module is the only place that calls ``jax.pmap`` and ``jax.lax.pmean``.
Inside ``pmap``, ``pmean`` averages over every device of every process (the
mapped axis spans ``jax.device_count()`` devices in a multi-process job), so
each device holds the full-batch mean gradient after the collective.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from worker.contract import sections
from worker.contract.metrics import STEP_METRICS
from worker.data.order import WEIGHT
from worker.data.sources import aligned
from worker.trainer.calls import StepCalls

AXIS = "batch"  # the seed's axis name


def make_optimizer(spec: sections.Optimizer) -> optax.GradientTransformation:
    """The optax optimizer the job's ``optimizer`` section names.

    Plain ``sgd`` gives exactly the seed's update ``p - learning_rate * g``
    (optax scales by ``-learning_rate`` and adds; both are exact negations);
    ``momentum`` None is no momentum. ``weight_decay`` is used by ``adamw`` only.
    """
    name, lr = spec.name, spec.learning_rate
    if name == "sgd":
        return optax.sgd(lr, momentum=spec.momentum)
    if name == "adam":
        return optax.adam(lr)
    if name == "adamw":
        return optax.adamw(lr, weight_decay=spec.weight_decay)
    raise ValueError(f"unknown optimizer {name!r}")


def packed_pmean(tree: Any, axis_name: str = AXIS) -> Any:
    """``jax.lax.pmean`` of every leaf of ``tree`` as one collective per dtype.

    The leaves of each dtype are raveled into one flat buffer
    (``jax.flatten_util.ravel_pytree``), averaged with one ``pmean``, and
    unraveled: the same elementwise sums as a ``pmean`` per leaf, but one
    all-reduce instead of one per leaf, which is what a step across
    processes waits for (gloo on CPU: one round trip each).

    Args:
      tree: a pytree of arrays (inside ``pmap`` over ``axis_name``).

    Returns:
      ``tree`` with every leaf averaged over ``axis_name``; shapes and dtypes unchanged.
    """
    from jax.flatten_util import ravel_pytree

    leaves, treedef = jax.tree_util.tree_flatten(tree)
    out = list(leaves)
    for dtype in dict.fromkeys(jnp.result_type(leaf) for leaf in leaves):
        index = [i for i, leaf in enumerate(leaves) if jnp.result_type(leaf) == dtype]
        flat, unravel = ravel_pytree([leaves[i] for i in index])
        for i, leaf in zip(index, unravel(jax.lax.pmean(flat, axis_name=axis_name))):
            out[i] = leaf
    return jax.tree_util.tree_unflatten(treedef, out)


def make_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, state: Any,
                    steps_per_call: int = 1, allreduce: str = "per_leaf",
                    metrics_fn: Callable | None = None,
                    metrics_every: int | None = None, unroll: int = 1,
                    donate: bool = True) -> StepCalls:
    """Build the pmapped calls of the step (``worker.trainer.calls.StepCalls``).

    Args:
      loss_fn: ``(params, batch) -> loss``, the per-device batch mean; ``batch``
        a dict of named arrays ``[per_device_batch_size, ...]`` (``worker.data.batches``).
      optimizer: the optax optimizer.
      state: ``(params, opt_state)`` (any layout): its tree structure is the calls'.
      steps_per_call: k optimizer steps per call (``lax.scan`` over the
        step, one device loop, traced once). With k > 1 a call takes a window of
        batches and the index of the first (below).
      allreduce: ``per_leaf`` (a ``pmean`` of each gradient and of the loss, as
        the seed) or ``packed`` (``packed_pmean``: one collective per dtype);
        the same values.
      metrics_fn: optional ``(params, batch) -> {name: scalar}`` (a task's
        ``metrics_fn``, e.g. accuracy) on the params before the update,
        averaged over every device like the loss; appended to ``metrics`` in
        the dict's order.
      metrics_every: with k > 1, the call's steps whose metrics are returned:
        every ``metrics_every``-th (a divisor of k; default k, the last step only).
        Nothing is kept of the steps between (``worker.trainer.calls.metrics_every``).
      unroll: with k > 1, steps per turn of the device loop (``step_function``).
      donate: the call's state is donated (its buffers reused for the new state); False
        keeps a second copy of the state on the devices during a call
        (``worker.trainer.calls.donate``).

    Args (of a call, k = 1), each with a leading ``[local_device_count]`` axis:
      state: the leaves of the replicated ``(params, opt_state)`` (float32), donated.
      batch: dict of arrays ``[local_device_count, per_device_batch_size, ...]``.

    Args (k > 1): ``(state, window, first)``:
      window: dict of arrays ``[local_device_count, W, per_device_batch_size, ...]``;
        step i of the call (0-based) uses entry ``(first + i) % W``.
      first: ``[local_device_count]`` int32 (equal on every device).

    Returns (of a call): the new state, and for a ``rows`` call ``metrics``:
      ``[local_device_count, 3 + M]`` float32, columns ``worker.contract.metrics.STEP_METRICS``
      (the global-batch mean loss, and the global L2 norm, ``optax.global_norm``, of the
      averaged gradient and of the updated params) then the M values of ``metrics_fn``;
      equal on every device. One array, so a log step is read back with one device-to-host
      transfer. With k > 1 ``[local_device_count, R, 3 + M]``, R = k / metrics_every: the
      rows of steps ``metrics_every``, ``2 * metrics_every``, ..., k of the call, in order.

    Raises:
      ValueError: ``allreduce`` is neither ``per_leaf`` nor ``packed``.
    """
    average = averaging(allreduce, jax.device_count())
    treedef = jax.tree_util.tree_structure(state)

    def mapped(with_metrics: bool) -> Callable:
        step = step_function(loss_fn, optimizer, average, with_metrics, steps_per_call,
                             metrics_fn, metrics_every, unroll)
        return jax.pmap(flat_state(step, treedef), axis_name=AXIS,
                        donate_argnums=(0,) if donate else ())

    if jax.process_count() > 1:  # pmap's lowering takes this process's arrays as the whole
        return StepCalls(treedef, mapped(True))
    return StepCalls(treedef, mapped(True), mapped(False), run_compiled=True)


def flat_state(step: Callable, treedef: Any) -> Callable:
    """``step`` (``(params, opt_state, *inputs) -> (params, opt_state, *rest)``) over the
    state's leaves: ``(state, *inputs) -> state`` with no ``rest``, else ``(state, *rest)``."""
    def call(state, *inputs):
        params, opt_state, *rest = step(*treedef.unflatten(state), *inputs)
        state = treedef.flatten_up_to((params, opt_state))
        return (state, *rest) if rest else state

    return call


def averaging(allreduce: str, device_count: int | None = None) -> Callable[[tuple], tuple]:
    """``(grads, loss, extra) -> the same`` averaged over the ``AXIS`` of every device:
    ``packed`` (``packed_pmean``, one collective per dtype) or ``per_leaf`` (a ``pmean``
    of the gradients, then of the loss, then of the extra metrics, as the seed).

    With ``device_count`` 1 (one process on one device: one chip) ``packed`` is ``per_leaf``:
    there is no collective to save, a mean over one device compiles to nothing, and
    ``packed``'s ravel and unravel are copies inside every step of a fused call (on a TPU
    v5e they held the 256 x 4 step at 283k steps/s against 384k without them,
    at 1,000 steps a call, measured by bench/step_account.py's predecessor; docs/tpu.md).

    Raises:
      ValueError: ``allreduce`` is neither.
    """
    if allreduce not in ("packed", "per_leaf"):
        raise ValueError(f"allreduce: expected per_leaf or packed, got {allreduce!r}")
    if allreduce == "packed" and device_count != 1:
        return packed_pmean

    def per_leaf_pmean(parts: tuple) -> tuple:
        return tuple(jax.lax.pmean(part, axis_name=AXIS) for part in parts)

    return per_leaf_pmean


def step_function(loss_fn: Callable, optimizer: optax.GradientTransformation,
                  average: Callable[[tuple], tuple], with_metrics: bool = False,
                  steps_per_call: int = 1, metrics_fn: Callable | None = None,
                  metrics_every: int | None = None, unroll: int = 1) -> Callable:
    """The step before it is mapped: ``make_train_step``'s (pmap) and ``worker.trainer.sharded``'s (jit).

    Args:
      loss_fn, optimizer, steps_per_call, metrics_fn, metrics_every: as ``make_train_step``.
      average: ``(grads, loss, extra) -> the same`` averaged over every device
        (``averaging``: ``pmean`` over ``AXIS``, which ``pmap`` and
        ``worker.trainer.sharded``'s ``vmap`` both name).
      with_metrics: also return the metrics (a ``rows`` call); the update is the same.
      unroll: with k > 1, steps per turn of the device loop between rows
        (``jax.lax.fori_loop``'s ``unroll``; ``worker.trainer.calls.unroll``): the same
        steps in the same order, fewer turns of the loop.

    Returns:
      ``(params, opt_state, batch) -> (params, opt_state[, metrics])`` for k = 1 (metrics
      ``[3 + M]``, column 0 the loss), or ``(params, opt_state, window, first)`` running k
      steps on the device (window: batches along axis 0 of every array; ``first``: an int32
      scalar), whose metrics gain a leading ``[k / metrics_every]`` axis, a row for every
      ``metrics_every``-th step of the call; shapes are one device's.

    Raises:
      ValueError: ``metrics_every`` does not divide ``steps_per_call``.
    """
    def train_step(params, opt_state, batch):
        if WEIGHT in batch:
            grads, loss, extra = weighted_means(loss_fn, metrics_fn if with_metrics else None,
                                                average, params, batch)
        else:
            loss, grads = jax.value_and_grad(loss_fn)(params, batch)
            extra = metrics_fn(params, batch) if (with_metrics and metrics_fn) else {}
            grads, loss, extra = average((grads, loss, extra))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        if not with_metrics:
            return new_params, opt_state
        # Read-only reductions of values the update already made: they add no
        # collective (grads are averaged already) and do not feed the update.
        metrics = jnp.stack([loss, optax.global_norm(grads), optax.global_norm(new_params)]
                            + [jnp.asarray(v, jnp.float32) for v in extra.values()])
        assert metrics.shape == (len(STEP_METRICS) + len(extra),)
        return new_params, opt_state, metrics

    if steps_per_call == 1:
        return train_step
    every = metrics_every or steps_per_call
    if steps_per_call % every:
        raise ValueError(f"metrics_every {every} does not divide steps_per_call {steps_per_call}")
    # The steps between two rows return nothing: on a TPU v5e any value kept per step (a
    # loss in the scan's output) cost the 256 x 4 step 15-60% of its rate (docs/tpu.md)
    bare_step = step_function(loss_fn, optimizer, average) if with_metrics else train_step

    def fused_steps(params, opt_state, window, first):
        size = jax.tree_util.tree_leaves(window)[0].shape[0]

        def batch_at(i):
            if size == 1:  # resident data of one batch: no index, no copy of it
                return jax.tree.map(lambda a: a[0], window)
            index = (first + i) % size
            return jax.tree.map(
                lambda a: jax.lax.dynamic_index_in_dim(a, index, axis=0, keepdims=False), window)

        def bare_steps(begin, count, carry):
            # ``count`` steps from the call's step ``begin`` (0-based), a loop of a static
            # trip count unrolled ``unroll`` steps a turn (``worker.trainer.calls.unroll``)
            if count <= 0:
                return carry
            return jax.lax.fori_loop(0, count, lambda i, c: bare_step(*c, batch_at(begin + i)),
                                     carry, unroll=turn_steps(count, unroll))

        if not with_metrics:
            return bare_steps(0, steps_per_call, (params, opt_state))

        def row(carry, r):
            last = (r + 1) * every - 1  # the row's step, 0-based within the call
            carry = bare_steps(last - every + 1, every - 1, carry)
            params, opt_state, metrics = train_step(*carry, batch_at(last))
            return (params, opt_state), metrics

        (params, opt_state), metrics = jax.lax.scan(
            row, (params, opt_state), jnp.arange(steps_per_call // every, dtype=jnp.int32))
        return params, opt_state, metrics

    return fused_steps


def turn_steps(count: int, unroll: int) -> int:
    """Steps per turn of a loop of ``count`` steps unrolled up to ``unroll``: the largest
    divisor of ``count`` from ``unroll // 2`` to ``unroll`` (a loop whose turns divide its
    steps has no remainder, which ``fori_loop`` runs as a second loop a step a turn: a row's
    99 steps between log steps are 11 turns of 9), else ``unroll``."""
    unroll = max(1, min(unroll, count))
    return next((u for u in range(unroll, max(1, unroll // 2) - 1, -1) if count % u == 0), unroll)


def weighted_means(loss_fn: Callable, metrics_fn: Callable | None,
                   average: Callable[[tuple], tuple], params: Any, batch: dict) -> tuple:
    """The global batch's mean gradient, loss and metrics when the devices hold padded rows.

    A run shrunk onto devices that do not divide ``global_batch_size`` pads each device's
    rows to the same count, with weight 0 (``worker.data.order``). Each row's loss is the task's
    loss of a batch of that row alone (the task's loss is a mean over rows, so this is its
    per-example term), and the gradient is that of ``sum(weight * loss)``. The sums and the
    weights' count are averaged over every device with ``average`` (``pmean``: a sum over
    devices divided by their number, the same for the sums and the count), and the mean is
    their ratio: ``sum over the global batch / global_batch_size``, the uninterrupted run's
    mean up to float rounding.

    Args:
      loss_fn, metrics_fn: the task's, over a dict batch of rows (metrics_fn may be None).
      average: ``averaging(...)``'s function.
      params: one device's params.
      batch: one device's dict of ``[per_device_batch_size, ...]`` arrays with ``WEIGHT``.

    Returns:
      ``(grads, loss, extra)``: the weighted means, as ``average`` returns them unweighted.
    """
    rows = {name: a for name, a in batch.items() if name != WEIGHT}
    weight = batch[WEIGHT]

    def per_row(fn, params):
        return jax.vmap(lambda row: fn(params, jax.tree.map(lambda a: a[None], row)))(rows)

    def weighted_sum(params):
        return jnp.sum(weight * per_row(loss_fn, params))

    total, grads = jax.value_and_grad(weighted_sum)(params)
    extra = {}
    if metrics_fn is not None:
        extra = {name: jnp.sum(weight * values)
                 for name, values in per_row(metrics_fn, params).items()}
    grads, total, extra, count = average((grads, total, extra, jnp.sum(weight)))
    return (jax.tree.map(lambda g: g / count, grads), total / count,
            {name: v / count for name, v in extra.items()})


def replicate(tree: Any) -> Any:
    """A copy of every leaf per local device: ``[...]`` -> ``[local_device_count, ...]``."""
    n = jax.local_device_count()
    return jax.tree.map(lambda a: np.broadcast_to(np.asarray(a), (n,) + np.shape(a)).copy(), tree)


def place(tree: Any) -> Any:
    """Put a batch on the local devices, in the layout ``pmap`` expects.

    Safe to call from the input pipeline's thread (``worker.data.batches.Batches``).
    ``jax.device_put`` with a sharding over the local devices' leading axis: on CPU
    devices a C-contiguous, ``worker.data.sources.ALIGN_BYTES``-aligned host array is used in
    place, no copy (``worker.data.batches`` reads batches that way); any other array is first
    copied once into an aligned one. A host array given here must not be written
    afterwards (the devices may be reading it).

    Args:
      tree: a pytree (a dict of named arrays) of numpy arrays, each
        ``[local_device_count, ...]``: leading entry d goes to local device d.

    Returns:
      The same pytree of device arrays, sharded over the local devices.
    """
    return jax.device_put(jax.tree.map(lambda a: aligned(np.asarray(a)), tree), _local_sharding())


@functools.cache
def _local_sharding() -> NamedSharding:
    """Leading axis split over the local devices, in order: what ``pmap`` takes as is."""
    return NamedSharding(Mesh(np.array(jax.local_devices()), (AXIS,)), PartitionSpec(AXIS))


def placer(steps_per_call: int = 1) -> Callable[[Any], Any]:
    """The function ``worker.data.batches.Batches`` puts batches on the devices with: ``place``
    (pmap's layout is the same for a batch, a window of batches and a call's first index)."""
    return place


def unreplicate(tree: Any) -> Any:
    """Device 0's copy of every leaf, as numpy: ``[local_device_count, ...]`` -> ``[...]``.

    A device array's copy is read off its first device alone (``addressable_data(0)``, its
    ``[1, ...]`` part of pmap's layout): ``a[0]`` would compile and run a gather on the
    devices, 0.4 s the first time on CPU, at the first checkpoint and at the end of every run.
    """
    def first(a):
        if isinstance(a, jax.Array):
            return np.asarray(a.addressable_data(0))[0]
        return np.asarray(a[0])

    return jax.tree.map(first, tree)
