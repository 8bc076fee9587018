"""How the step is spread over the devices, as a value: ``of("pmap")`` or ``of("jit")`` (``auto``: one of them).

Both implementations run the seed's per-device step (``value_and_grad`` and a mean of
gradients and loss over every device) and end at the same params; they differ in how
arrays are laid out. ``pmap`` (``worker.trainer.train``): ``jax.pmap`` over this process's
devices, every leaf stacked ``[local_device_count, ...]``. ``jit`` (``worker.trainer.sharded``):
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


def of(name: str, steps_per_call: int = 1, num_processes: int = 1,
       local_device_count: int = 1) -> Parallelism:
    """The ``Parallelism`` named by ``train.parallelism``.

    ``auto`` is pmap (the seed's step) except with one device per process, and for fused
    calls (``steps_per_call`` > 1) in one process, where it is jit. With one device per
    process a call's host work under a multi-process pmap (not compiled ahead: its lowering
    takes each process's arrays as the whole) is the short step's cost: at one step a call
    on CPU devices jit ran 3.0x pmap's steps/s at 2 x 1 (1,820 against 603, idle machine;
    2.4x under load) and 1.06x at 1 x 1 (29.3k against 27.7k idle, 1.7-2.0x under load;
    docs/benchmarks.md).
    A ``lax.scan`` inside ``pmap`` ran 1.05-16 times slower than under jit on CPU devices (16x
    at 1 x 1 and k = 1,000, 1.9x at 1 x 4 and k = 100), while with several processes of
    several devices each pmap was ahead (2 x 2, k = 100: jit 0.70x).

    Raises:
      ValueError: not ``auto``, ``pmap`` or ``jit`` (the spec and job.json refuse others first).
    """
    if name == "auto":
        jit = local_device_count == 1 or (steps_per_call > 1 and num_processes == 1)
        name = "jit" if jit else "pmap"
    if name == "pmap":
        from worker.trainer import train as module
        description = ""
    elif name == "jit":
        from worker.trainer import sharded as module
        description = "jax.jit over a global mesh"
    else:
        raise ValueError(f"train.parallelism {name!r}: expected 'auto', 'pmap' or 'jit'")
    return Parallelism(name, description, module.make_train_step, module.replicate,
                       module.unreplicate, module.placer)
