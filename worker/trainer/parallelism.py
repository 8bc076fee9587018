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
      make_train_step: ``(loss_fn, optimizer, state, steps_per_call=, allreduce=,
        metrics_fn=, metrics_every=) -> worker.trainer.calls.StepCalls``: the step's calls
        over the leaves of ``state`` (``(params, opt_state)``) in this layout.
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
       local_device_count: int = 1, constant_batch: bool = False) -> Parallelism:
    """The ``Parallelism`` named by ``train.parallelism``.

    ``auto`` is pmap (the seed's step) except in one process of one device, and for fused
    calls (``steps_per_call`` > 1) in one process or with one device per process, where it is
    jit: there a ``lax.scan`` inside ``pmap`` ran 1.05-16 times slower than under jit on CPU
    devices (16x at 1 x 1 and k = 1,000, 1.9x at 1 x 4 and k = 100), while with several
    processes of several devices each pmap was ahead (2 x 2, k = 100: jit 0.70x;
    docs/benchmarks.md). In one process of one device the two are the same program, and at
    one step a call jit's dispatch is the cheaper: the 256 x 4 step's call 25.4 us against
    pmap's compiled executable's 32.7 on one CPU device, the hand-written loop's 23.8 (seven
    interleaved rounds in one process, docs/benchmarks.md). With one device per process in
    several processes jit also ran 3.0x pmap at 2 x 1, but XProf's overview page finds no steps
    in a jit trace on CPU devices (its trace viewer has each step), so ``auto`` keeps pmap
    there; a 1 x 1 run on CPU devices, jit now, gives up the same overview (docs/monitoring.md).
    A batch made a constant of the program (``constant_batch``:
    ``worker.trainer.calls.constant_batch``) is jit's alone.

    Raises:
      ValueError: not ``auto``, ``pmap`` or ``jit`` (the spec and job.json refuse others first).
    """
    if name == "auto":
        alone = num_processes == 1 and local_device_count == 1
        fused_alone = steps_per_call > 1 and (num_processes == 1 or local_device_count == 1)
        name = "jit" if alone or fused_alone or constant_batch else "pmap"
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
