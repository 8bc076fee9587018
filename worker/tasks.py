"""Tasks: what is trained. A task gives initial params and a per-example loss.

A user's task plugs in as ``task.name: package.module:function`` in the spec;
``function(**task.args)`` must return a ``Task``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import jax
import jax.numpy as jnp

Params = Any  # a pytree of arrays


@dataclasses.dataclass(frozen=True)
class Task:
    """A trainable model.

    Attributes:
      init_params: ``(key, in_features, out_features) -> params``; key is a
        ``jax.random`` key, params a pytree of float32 arrays.
      loss_fn: ``(params, x, y) -> loss``; x ``[batch, in_features]`` float32,
        y ``[batch, out_features]`` float32, loss a float32 scalar, the mean
        over the batch (so that pmean over equal shards is the global mean).
      on_step_end: optional ``(step, process_id) -> None`` called on the host
        after each step (``step`` counts completed steps, from 1); with
        ``train.steps_per_call`` k > 1, for each of a call's k steps in order
        once the call has finished. For instrumentation; it must not touch
        device values, or each step syncs.
    """

    init_params: Callable[[jax.Array, int, int], Params]
    loss_fn: Callable[[Params, jax.Array, jax.Array], jax.Array]
    on_step_end: Callable[[int, int], None] | None = None


def predict(params: Params, x: jax.Array) -> jax.Array:
    """The seed's linear model: ``x @ w + b``; x ``[batch, in]`` -> ``[batch, out]``."""
    w, b = params
    return x @ w + b


def mse(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean squared error of ``predict`` (the seed's ``loss_fn``)."""
    return jnp.mean((predict(params, x) - y) ** 2)


def init_linear(key: jax.Array, in_features: int, out_features: int) -> Params:
    """The seed's initialisation: w ~ N(0, 1) * 0.1 ``[in, out]``, b = 0 ``[out]``."""
    k1, _ = jax.random.split(key)
    return (jax.random.normal(k1, (in_features, out_features)) * 0.1,
            jnp.zeros((out_features,)))


def linear_regression() -> Task:
    """The seed's linear regression (shared/seed.md)."""
    return Task(init_params=init_linear, loss_fn=mse)


BUILTIN = {"linear_regression": linear_regression}


def resolve(name: str, args: dict) -> Task:
    """Build the task a spec names.

    Args:
      name: a built-in name or ``package.module:function``.
      args: keyword arguments for the function.

    Raises:
      ImportError: the module cannot be imported.
      TypeError: the function does not return a Task or rejects ``args``.
    """
    if name in BUILTIN:
        factory = BUILTIN[name]
    else:
        module_name, _, function = name.partition(":")
        factory = getattr(importlib.import_module(module_name), function)
    task = factory(**args)
    if not isinstance(task, Task):
        raise TypeError(f"task {name} returned {type(task).__name__}, expected worker.tasks.Task")
    return task
