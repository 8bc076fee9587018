"""This machine's GPUs as the driver names them, and their tenants: NVML (NVIDIA's management
library, through ``pynvml`` of the nvidia-ml-py package), asked once before a gpu run starts.

A process that merely holds a ``/dev/nvidia*`` file open is no tenant: ``nvidia-persistenced``,
Xorg and monitoring agents hold them for good on GPU servers (NVIDIA gpu-operator #118), so a
check by open files refused every launch there. The driver's list of compute processes names
the real tenants and the memory each holds; GPUs are shared by default, so what hurts a JAX
run is memory another process holds while JAX preallocates 75% of each GPU's at start
(``XLA_PYTHON_CLIENT_MEM_FRACTION``, JAX's "GPU memory allocation" docs). That is said before
the start, with what to do; nothing is refused for it.

Without NVML (no pynvml, no driver) nothing is checked, and that is said plainly.
"""

from __future__ import annotations

import dataclasses

from launcher import proctl
from launcher.console.lines import printable
from launcher.words import plural

PREALLOCATED = 0.75  # of each GPU's memory, JAX's default preallocation (XLA_PYTHON_CLIENT_MEM_FRACTION)


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU as NVML reports it.

    Attributes:
      index: NVML's index (PCI bus order).
      minor: the minor number of its device file (``/dev/nvidiaN``: N).
      uuid: ``GPU-<uuid>``.
      name: its model (``NVIDIA H200``).
      total_bytes: its memory.
      processes: ``[(pid, bytes held or None)]``, the compute processes NVML lists on it.
    """

    index: int
    minor: int
    uuid: str
    name: str
    total_bytes: int
    processes: tuple


def gpus() -> tuple:
    """(every GPU NVML reports, None), or (None, why NVML did not answer)."""
    try:
        import pynvml  # nvidia-ml-py: optional, asked only for a gpu run
    except ImportError:
        return None, "pynvml (pip install nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"NVML did not start ({_text(exc)})"
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            processes = tuple((p.pid, p.usedGpuMemory)
                              for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
            found.append(Gpu(index, int(pynvml.nvmlDeviceGetMinorNumber(handle)),
                             _text(pynvml.nvmlDeviceGetUUID(handle)),
                             _text(pynvml.nvmlDeviceGetName(handle)),
                             int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), processes))
        return found, None
    except pynvml.NVMLError as exc:
        return None, f"NVML failed ({_text(exc)})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def used(found: list, ids: tuple) -> list:
    """The GPUs of ``found`` a run's ids name (``CUDA_VISIBLE_DEVICES`` entries: the device
    file's number, or a ``GPU-<uuid>`` or a prefix of one), in the order of ``ids``."""
    out = []
    for gpu_id in ids:
        for gpu in found:
            if gpu_id == str(gpu.minor) or (gpu_id.startswith("GPU-") and gpu.uuid.startswith(gpu_id)):
                out.append(gpu)
                break
    return out


def described(gpu: Gpu) -> str:
    """``GPU 4 (NVIDIA H200, GPU-5b1c...)``: how the dry run and the notes name a GPU."""
    return f"GPU {gpu.minor} ({gpu.name}, {gpu.uuid})"


def notes(ids: tuple) -> list:
    """What to say before a gpu run on the GPUs ``ids`` names: each other process holding
    memory on one of them, with what to do; or that nothing could be checked, and why."""
    found, why = gpus()
    if found is None:
        return [f"GPUs: which processes use them was not checked: {why}; another process's "
                "memory on a GPU makes JAX's start fail (it preallocates 75% of each)"]
    out = []
    for gpu in used(found, ids):
        held = [(pid, size) for pid, size in gpu.processes if pid != 0]
        if not held:
            continue
        amount = sum(size or 0 for _, size in held)
        who = "; ".join(f"pid {pid} ({printable(proctl.cmdline(pid)) or '?'}) "
                        + (f"{size / 2**20:,.0f} MiB" if size is not None else "memory")
                        for pid, size in held)
        short = amount > (1 - PREALLOCATED) * gpu.total_bytes
        out.append(f"{described(gpu)}: {plural(len(held), 'other process')} hold "
                   f"{amount / 2**20:,.0f} of its {gpu.total_bytes / 2**20:,.0f} MiB: {who}; "
                   + ("JAX preallocates 75% of it at start, which is more than is free: wait "
                      "for them to end, stop them, or set cluster.env."
                      "XLA_PYTHON_CLIENT_MEM_FRACTION (say 0.4) or "
                      "XLA_PYTHON_CLIENT_PREALLOCATE: 'false'" if short else
                      "JAX's 75% preallocation still fits beside them"))
    return out
