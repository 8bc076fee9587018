"""How the step is spread over the devices, as a value: ``of("pmap")`` or ``of("jit")``.

Both implementations run the seed's per-device step (``value_and_grad`` and a mean of
gradients and loss over every device) and end at the same params; they differ in how
arrays are laid out. ``pmap`` (``worker.train``): ``jax.pmap`` over this process's
devices, every leaf stacked ``[local_device_count, ...]``. ``jit`` (``worker.sharded``):
``jax.jit`` over a global ``Mesh`` of every device, the batch sharded with
``NamedSharding`` and the params replicated. The trainer holds a ``Parallelism`` and
calls its functions; nothing else tells the two apart. Importing this module imports no
jax: ``of`` imports the implementation it returns.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Parallelism:
    """One way to spread the step (``train.parallelism``).

    Attributes:
      name: ``pmap`` or ``jit``.
      description: how the worker's start line says it ("" for the default, pmap).
      make_train_step: ``(loss_fn, optimizer, with_metrics=, steps_per_call=, allreduce=,
        metrics_fn=) -> step``; the step maps ``(params, opt_state, batch)`` to
        ``(params, opt_state, loss[, metrics])`` in this layout.
      replicate: a host pytree -> the same, on every local device, in this layout.
      unreplicate: the reverse: one host copy (numpy), for checkpoints and the final params.
      placer: ``steps_per_call -> (batch -> batch on the devices)``.
    """

    name: str
    description: str
    make_train_step: Callable[..., Callable]
    replicate: Callable[[Any], Any]
    unreplicate: Callable[[Any], Any]
    placer: Callable[[int], Callable[[Any], Any]]


def of(name: str) -> Parallelism:
    """The ``Parallelism`` named by ``train.parallelism``.

    Raises:
      ValueError: not ``pmap`` or ``jit`` (the spec and job.json refuse others first).
    """
    if name == "pmap":
        from worker import train as module
        description = ""
    elif name == "jit":
        from worker import sharded as module
        description = "jax.jit over a global mesh"
    else:
        raise ValueError(f"train.parallelism {name!r}: expected 'pmap' or 'jit'")
    return Parallelism(name, description, module.make_train_step, module.replicate,
                       module.unreplicate, module.placer)
