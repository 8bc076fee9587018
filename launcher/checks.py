"""Checks of this machine that a job needs before anything starts here.

Backends that run workers on this machine (single-host debug mode, the TPU
rehearsal) call them from ``Backend.check``; the spec itself is checked on
load (``launcher.spec``). Each raises ``SpecError`` naming the spec key.
"""

from __future__ import annotations

import importlib.util
import os

from launcher.errors import Problem, SpecError

BUILTIN_TASKS = ("linear_regression",)


def check_fits_in_memory(spec, memory_bytes: int | None = None) -> None:
    """For local runs: synthetic data that cannot fit in this machine's memory is refused.

    Every process holds its rows of every global batch twice (numpy, and the
    copy on its CPU devices: ``worker.train.place``), so the processes on this
    machine together need ``2 x rows x (in_features + out_features) x 4`` bytes,
    rows being the ``num_examples`` that fill whole global batches.

    Raises:
      SpecError: that exceeds 80% of the machine's memory (``memory_bytes``,
        default the physical memory from ``sysconf``).
    """
    data = spec.data
    if data.source != "synthetic":
        return
    if memory_bytes is None:
        memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    rows = data.num_examples // spec.train.global_batch_size * spec.train.global_batch_size
    need = 2 * rows * (data.in_features + data.out_features) * 4
    if need > 0.8 * memory_bytes:
        gib = 1 << 30
        raise SpecError([Problem(*spec.where(("data", "num_examples")), "data.num_examples",
                                 f"{rows} rows x {data.in_features + data.out_features} float32 "
                                 f"columns need about {need / gib:.1f} GiB here (every process "
                                 f"holds its rows twice), more than 80% of this machine's "
                                 f"{memory_bytes / gib:.1f} GiB; lower data.num_examples or "
                                 "data.in_features")])


def check_task_importable(spec) -> None:
    """For local runs: a user task's module must be findable (it is not imported here).

    Raises:
      SpecError: the module cannot be found on this machine's sys.path.
    """
    if spec.task.name in BUILTIN_TASKS:
        return
    module = spec.task.name.split(":")[0]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise SpecError([Problem(*spec.where(("task", "name")), "task.name",
                                 f"module {module!r} is not importable here; install it or add its "
                                 "directory to PYTHONPATH")])
