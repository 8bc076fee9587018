"""The distributed train step: the seed's pmap + value_and_grad + pmean.

This module is the only place that calls ``jax.pmap`` and ``jax.lax.pmean``.
Inside ``pmap``, ``pmean`` averages over every device of every process (the
mapped axis spans ``jax.device_count()`` devices in a multi-process job), so
each device holds the full-batch mean gradient after the collective.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from worker import job as jobs
from worker.metrics import STEP_METRICS

AXIS = "batch"  # the seed's axis name


def make_optimizer(spec: jobs.OptimizerConfig) -> optax.GradientTransformation:
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


def make_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation,
                    with_metrics: bool = False) -> Callable:
    """Build the pmapped step ``(params, opt_state, x, y) -> (params, opt_state, loss[, metrics])``.

    Args:
      loss_fn: ``(params, x, y) -> loss``, the per-device batch mean.
      optimizer: the optax optimizer.
      with_metrics: also return ``metrics``; the update is the same either way.

    Args (of the returned function), each with a leading ``[local_device_count]`` axis:
      params, opt_state: replicated pytrees (float32).
      x: ``[local_device_count, per_device_batch_size, in_features]`` float32.
      y: ``[local_device_count, per_device_batch_size, out_features]`` float32.

    Returns:
      New params and opt_state (replicated), and loss ``[local_device_count]``
      float32, the global-batch mean loss, equal on every device. With
      ``with_metrics``, also ``metrics``: ``[local_device_count, 3]`` float32,
      columns ``worker.metrics.STEP_METRICS``: the loss, and the global L2 norm
      (``optax.global_norm``) of the averaged gradient and of the updated
      params; equal on every device. One array, so a log step is read back
      with one device-to-host transfer (three took 58 us, one 15 us).
    """

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        grads = jax.lax.pmean(grads, axis_name=AXIS)
        loss = jax.lax.pmean(loss, axis_name=AXIS)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        if not with_metrics:
            return new_params, opt_state, loss
        # Read-only reductions of values the update already made: they add no
        # collective (grads are averaged already) and do not feed the update.
        metrics = jnp.stack([loss, optax.global_norm(grads), optax.global_norm(new_params)])
        assert metrics.shape == (len(STEP_METRICS),)
        return new_params, opt_state, loss, metrics

    return jax.pmap(train_step, axis_name=AXIS, donate_argnums=(0, 1))


def replicate(tree: Any) -> Any:
    """A copy of every leaf per local device: ``[...]`` -> ``[local_device_count, ...]``."""
    n = jax.local_device_count()
    return jax.tree.map(lambda a: np.broadcast_to(np.asarray(a), (n,) + np.shape(a)).copy(), tree)


_identity = None


def place(batches: np.ndarray) -> list:
    """Put every batch on the local devices once, in the layout ``pmap`` expects.

    Args:
      batches: ``[num_batches, local_device_count, per_device_batch_size, ...]``.

    Returns:
      num_batches device arrays ``[local_device_count, per_device_batch_size, ...]``.
      Feeding these instead of numpy saves a host-to-device copy per step.
    """
    global _identity
    if _identity is None:
        _identity = jax.pmap(lambda a: a)  # no collective: a pure placement
    return [_identity(batch) for batch in batches]


class InFlight:
    """Bounds how many dispatched steps may be queued ahead of the devices.

    JAX dispatches asynchronously: without a sync, the host enqueues steps
    as fast as it can. With several CPU devices per process, executions of
    different steps then interleave on XLA's thread pool, and a device blocked
    in step s's cross-process all-reduce (gloo) can wait forever for a peer
    device busy with step s+1: seen as a deadlock after step 1 with 2 processes
    x 2 devices and 50 steps between logs, every time. Waiting for step
    s - max_steps + 1 before dispatching more keeps the devices fed (a step is
    always queued) without a sync on the step just dispatched.

    So once step s + max_steps has been dispatched, step s has finished and its
    outputs can be read without waiting (``worker.metrics`` reads log steps then).
    """

    def __init__(self, max_steps: int = 2):
        self.max_steps = max_steps
        self._pending: list = []

    def add(self, output: Any) -> None:
        """Record a dispatched step's output; block on the oldest beyond the bound."""
        self._pending.append(output)
        if len(self._pending) > self.max_steps:
            jax.block_until_ready(self._pending.pop(0))


def unreplicate(tree: Any) -> Any:
    """Device 0's copy of every leaf, as numpy."""
    return jax.tree.map(lambda a: np.asarray(a[0]), tree)
