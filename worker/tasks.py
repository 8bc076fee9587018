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
        ``jax.random`` key, params a pytree of float32 arrays. ``in_features``
        is the last dimension of the batch's ``x``; ``out_features`` that of a
        float ``y`` (1 for integer labels).
      loss_fn: ``(params, x, y) -> loss``; x ``[batch, in_features]`` float32,
        y ``[batch, out_features]`` float32, loss a float32 scalar, the mean
        over the batch (so that pmean over equal shards is the global mean).
        Or give ``batch_loss_fn`` instead.
      on_step_end: optional ``(step, process_id) -> None`` called on the host
        after each step (``step`` counts completed steps, from 1); with
        ``train.steps_per_call`` k > 1, for each of a call's k steps in order
        once the call has finished. For instrumentation; it must not touch
        device values, or each step syncs. At a successful end the worker runs
        the atexit hooks and joins the non-daemon threads such a hook started,
        then exits without the interpreter's teardown: close the files it opens.
      batch_loss_fn: ``(params, batch) -> loss``, batch a dict of named arrays
        ``[batch, ...]`` (``x`` and ``y`` from a ``.npy``/``.csv``, every array
        of an ``.npz``; integer labels as int32): for tasks that need more than
        one float ``x`` and ``y``.
      metrics_fn: optional ``(params, batch) -> {name: float32 scalar}``, batch
        means (e.g. ``accuracy``), averaged over every device and logged with
        the loss (TensorBoard, metrics.jsonl) at log steps.
      num_classes: for integer labels, how many classes: a label outside
        ``0..num_classes - 1`` is a data error naming its file, row and column
        (in cross-entropy it would be a NaN loss or silently wrong training).
    """

    init_params: Callable[[jax.Array, int, int], Params]
    loss_fn: Callable[[Params, jax.Array, jax.Array], jax.Array] | None = None
    on_step_end: Callable[[int, int], None] | None = None
    batch_loss_fn: Callable[[Params, dict], jax.Array] | None = None
    metrics_fn: Callable[[Params, dict], dict] | None = None
    num_classes: int | None = None

    def __post_init__(self):
        if (self.loss_fn is None) == (self.batch_loss_fn is None):
            raise TypeError("a Task needs exactly one of loss_fn (params, x, y) and "
                            "batch_loss_fn (params, batch)")

    def batch_loss(self) -> Callable[[Params, dict], jax.Array]:
        """The loss as ``(params, batch) -> loss`` (``loss_fn`` reads ``batch["x"]``, ``batch["y"]``)."""
        if self.batch_loss_fn is not None:
            return self.batch_loss_fn
        loss_fn = self.loss_fn
        return lambda params, batch: loss_fn(params, batch["x"], batch["y"])


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


def softmax_cross_entropy(params: Params, batch: dict) -> jax.Array:
    """Mean softmax cross-entropy of the linear model's logits ``x @ w + b`` against
    integer labels ``batch["y"]`` ``[batch]`` int32 (``optax.softmax_cross_entropy_with_integer_labels``)."""
    import optax

    logits = predict(params, batch["x"])
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]))


def accuracy(params: Params, batch: dict) -> dict:
    """``{"accuracy": fraction of rows whose arg-max logit is the label}`` (float32)."""
    logits = predict(params, batch["x"])
    return {"accuracy": jnp.mean((jnp.argmax(logits, axis=-1) == batch["y"]).astype(jnp.float32))}


def softmax_classifier(num_classes: int, input_scale: float = 1.0) -> Task:
    """Multinomial logistic regression: ``softmax(x * input_scale @ w + b)`` over ``num_classes``.

    Needs integer labels (``data.target_dtype: int32``); logs ``accuracy``.

    Args:
      num_classes: classes; labels are 0 to ``num_classes - 1``.
      input_scale: multiplies the features first (e.g. 1/16 for 0-16 pixels).
    """
    if not isinstance(num_classes, int) or num_classes < 2:
        raise TypeError(f"num_classes: expected an integer >= 2, got {num_classes!r}")

    def init(key, in_features, out_features):
        return init_linear(key, in_features, num_classes)

    def scaled(batch):
        return {**batch, "x": batch["x"] * input_scale}

    return Task(init_params=init,
                batch_loss_fn=lambda params, batch: softmax_cross_entropy(params, scaled(batch)),
                metrics_fn=lambda params, batch: accuracy(params, scaled(batch)),
                num_classes=num_classes)


BUILTIN = {"linear_regression": linear_regression, "softmax_classifier": softmax_classifier}


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
