"""The local backend's cluster settings (``cluster:`` with ``backend: local``): how many
processes on this machine, on which devices, and what each is given.

What the devices are (their files, how TPU chips are split, which GPUs a process gets) is
``launcher.backends.local.devices``; these settings resolve against it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Literal

from launcher.backends.base import ClusterSettings
from launcher.backends.local.devices import (DEVICE_VARS, GPU_DEVICE_PATHS, LIBTPU_LOCKFILE,
                                             PCI_ORDER, TPU_DEVICE_PATHS, device_files, gpu_ids,
                                             tpu_split)
from launcher.spec import schema
from launcher.spec.schema import port_or_zero
from launcher.words import plural
from worker.contract import valuechecks
from worker.contract.sections import setting
from worker.contract.valuechecks import non_negative


PLATFORMS = ("cpu", "tpu", "gpu")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalCluster(ClusterSettings):
    """Single-host mode: every process on this machine, on its CPU (the default, for debugging),
    its TPU chips or its GPUs (``platform``; ``launcher.backends.local.devices``)."""

    backend: Literal["local"] = setting(
        "local", doc="local (this machine), ssh (docs/ssh.md: hosts, users, keys, known_hosts, "
        "workdir, python, setup, sync), tpu (docs/tpu.md: TPU name or slices, zone, project), "
        "slurm (docs/slurm.md: in an allocation or by submission; nodes, partition, time limit) "
        "or ray (docs/ray.md: a Ray cluster's address, resources per process, strategy)")
    platform: Literal["cpu", "tpu", "gpu", "auto"] = setting(
        "cpu", doc="the devices the processes train on: cpu (CPU devices, the debug mode), tpu "
        "(this machine's TPU chips), gpu (its GPUs) or auto (what JAX would pick: TPU chips if "
        "any, else GPUs, else the CPU; docs/tpu.md#on-one-tpu-vm)")
    num_processes: int | None = setting(
        None, check=valuechecks.in_range(1, 256),
        doc="worker processes to start; null: 2 on cpu, 1 on tpu (every chip), one per GPU on "
        "gpu, or on either the chips found divided by devices_per_process where that is set. On "
        "a TPU VM several processes split the chips only in the shapes libtpu knows: 4 "
        "chips 1, 2 or 4 processes, 8 chips 1, 2 or 8")
    devices_per_process: int | None = setting(
        None, check=valuechecks.in_range(1, 256),
        doc="devices each process sees; null: 2 on cpu (JAX_NUM_CPU_DEVICES), the chips or "
        "GPUs divided evenly among the processes")
    coordinator_port: int = setting(0, check=port_or_zero,
                                    doc="JAX coordinator port on 127.0.0.1; 0 picks a free one")
    grace_s: float = setting(3.0, check=non_negative,
                             doc="after SIGTERM, wait this long before SIGKILL")
    env: dict[str, schema.EnvValue] = setting({}, check=schema.env_names,
                                              doc="extra environment for every worker (strings or "
                                              "integers, passed exactly as written; secrets masked "
                                              "wherever printed); on tpu or gpu not the variables "
                                              "that give a process its chips (TPU_VISIBLE_CHIPS "
                                              "..., CUDA_VISIBLE_DEVICES): podlaunch sets them")
    tpu_device_paths: tuple[str, ...] = setting(
        TPU_DEVICE_PATHS, doc="globs of this machine's TPU chip files (numbered "
        "entries only), counted for a tpu run; a process holding one refuses the launch, named")
    gpu_device_paths: tuple[str, ...] = setting(
        GPU_DEVICE_PATHS, doc="globs of this machine's GPU files (numbered entries "
        "only), counted for a gpu run")
    libtpu_lockfile: str = setting(LIBTPU_LOCKFILE,
                                   doc="libtpu's lock file; its holder holds the chips")

    @functools.cached_property
    def chips(self) -> tuple:
        """The device files of the chips ``platform`` uses (none on cpu), in chip order."""
        if self.resolved_platform == "tpu":
            return device_files(self.tpu_device_paths)
        if self.resolved_platform == "gpu":
            return device_files(self.gpu_device_paths)
        return ()

    @functools.cached_property
    def gpus(self) -> tuple:
        """The GPUs a gpu run splits (``gpu_ids``): the launching shell's
        ``CUDA_VISIBLE_DEVICES`` where it exported one, else every GPU file's number."""
        return gpu_ids(self.chips, os.environ.get("CUDA_VISIBLE_DEVICES"))

    @property
    def gpu_order(self) -> str | None:
        """``CUDA_DEVICE_ORDER`` for the processes: the shell's where its list is split (each
        entry means what it meant there), else PCI_BUS_ID."""
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            return os.environ.get("CUDA_DEVICE_ORDER")
        return PCI_ORDER

    @property
    def device_count(self) -> int:
        """The chips or GPUs this run may use: every TPU chip; the GPUs of ``gpus``."""
        return len(self.gpus) if self.resolved_platform == "gpu" else len(self.chips)

    @property
    def devices_found_text(self) -> str:
        """``4 GPUs found on this machine (/dev/nvidia0, ...)``, and the shell's list where
        it narrows them."""
        name = "TPU chip" if self.resolved_platform == "tpu" else "GPU"
        text = (f"{plural(len(self.chips), name)} found on this machine "
                f"({', '.join(self.chips)})")
        given = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self.resolved_platform == "gpu" and given is not None:
            text += (f"; this shell's CUDA_VISIBLE_DEVICES={given} gives the run "
                     f"{plural(len(self.gpus), 'GPU')}, split among its processes")
        return text

    @functools.cached_property
    def resolved_platform(self) -> str:
        """``platform`` with ``auto`` answered from this machine's device files."""
        if self.platform != "auto":
            return self.platform
        if device_files(self.tpu_device_paths):
            return "tpu"
        return "gpu" if device_files(self.gpu_device_paths) else "cpu"

    @property
    def num_processes_total(self) -> int:
        if self.num_processes is not None:
            return self.num_processes
        if self.resolved_platform != "cpu" and self.devices_per_process is not None:
            return max(1, self.device_count // self.devices_per_process)
        if self.resolved_platform == "gpu":
            return max(1, self.device_count)
        return 2 if self.resolved_platform == "cpu" else 1

    @property
    def resolved_devices_per_process(self) -> int:
        """Devices each process sees: the setting, or the chips shared evenly (at least 1)."""
        if self.devices_per_process is not None:
            return self.devices_per_process
        if self.resolved_platform == "cpu":
            return 2
        return max(1, self.device_count // self.num_processes_total)

    def problems(self) -> list:
        """This machine's chips against the split asked for: none found, too few, a TPU
        split libtpu does not make (``tpu_split``), or ``env`` setting a variable that gives
        the processes their chips (``DEVICE_VARS``). Each problem names a key the user set
        where one is to blame (``num_processes`` derived from ``devices_per_process`` is not)."""
        platform, n = self.resolved_platform, self.num_processes_total
        if platform == "cpu":
            return []
        problems = [(("env", name), f"{name!r} is set by podlaunch itself for every process of a "
                     f"{platform} run (it gives each process its own "
                     f"{'TPU chips' if platform == 'tpu' else 'GPUs'}: "
                     f"{', '.join(DEVICE_VARS[platform])}); remove it, and choose the split with "
                     "cluster.num_processes and cluster.devices_per_process")
                    for name in self.env if name in DEVICE_VARS[platform]]
        paths = self.tpu_device_paths if platform == "tpu" else self.gpu_device_paths
        name = "TPU chip" if platform == "tpu" else "GPU"
        key = "num_processes" if self.num_processes is not None or \
            self.devices_per_process is None else "devices_per_process"
        if not self.chips:
            looked = (f"looked for {', '.join(paths)}" if paths else
                      f"looked for none: cluster.{platform}_device_paths is empty")
            return problems + [("platform", f"{platform}, but no {name} was found on this machine "
                                f"({looked}); run on a machine that has them, or use cpu")]
        if platform == "tpu":
            why = tpu_split(len(self.chips), n, self.devices_per_process)
            return problems + ([] if why is None else [(key, why)])
        count = self.device_count
        where = "found" if os.environ.get("CUDA_VISIBLE_DEVICES") is None else \
            f"of this shell's CUDA_VISIBLE_DEVICES ({os.environ['CUDA_VISIBLE_DEVICES']})"
        if n * self.resolved_devices_per_process > count:
            return problems + [(key, f"{plural(n, 'process')} x "
                                f"{plural(self.resolved_devices_per_process, name)} need more than "
                                f"the {plural(count, name)} {where}; use at most "
                                f"{count} in all" + (
                                    f" (devices_per_process {count} or less)"
                                    if key == "devices_per_process" else ""))]
        return problems
