"""This machine's accelerators for single-host mode: which chips, how they are split, who holds them.

Nothing here starts JAX: chips are counted from their device files, as libtpu and the
NVIDIA driver create them (a TPU VM's chips are ``/dev/accel0``... or, on newer VMs, numeric
entries of ``/dev/vfio/``; GPUs are ``/dev/nvidia0``...), so ``--dry-run`` can say what a
run would get without taking a chip.

A TPU VM's chips are split among processes with libtpu's own variables, the way JAX's
multi-process tests and torch_xla's single-host runner do it (``TPU_VISIBLE_CHIPS``,
``TPU_CHIPS_PER_PROCESS_BOUNDS``, ``TPU_PROCESS_BOUNDS``, ``TPU_PROCESS_ADDRESSES``,
``TPU_PROCESS_PORT``, ``CLOUD_TPU_TASK_ID``, ``ALLOW_MULTIPLE_LIBTPU_LOAD``), and only for the
shapes known to work (``TPU_SPLITS``): 4 chips (a 2 x 2 host: v4-8, v5p-8, v5e-4) 1, 2 or 4 per
process, 8 chips (a 2 x 4 host: v5e-8, v6e-8) 1, 4 or 8. One process always gets every chip,
with none of these set.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import re
from typing import Literal

from launcher import proctl
from launcher.errors import LaunchError
from launcher.backends.base import ClusterSettings
from launcher.console.lines import printable
from launcher.words import plural
from launcher.spec import schema
from worker.contract import sections
from launcher.spec.schema import port_or_zero
from worker.contract.sections import non_negative, setting

TPU_DEVICE_PATHS = ("/dev/accel*", "/dev/vfio/*")
GPU_DEVICE_PATHS = ("/dev/nvidia*",)
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"

# chips on the host -> {chips per process: (TPU_CHIPS_PER_PROCESS_BOUNDS, TPU_PROCESS_BOUNDS)}
# Bounds are x,y,z chip grids: 4 chips are 2 x 2, 8 chips 2 x 4 (chip i at x = i % 2).
TPU_SPLITS = {
    4: {1: ("1,1,1", "2,2,1"), 2: ("2,1,1", "1,2,1")},
    8: {1: ("1,1,1", "2,4,1"), 4: ("2,2,1", "1,2,1")},
}

# The variables that give a process its chips: the launcher decides them for every process of
# a tpu (libtpu's) or gpu (CUDA's) run, so neither cluster.env nor the shell that launches may
# set them (``tpu_env``, ``gpu_env``; the worker's environment drops what the shell exported).
TPU_VARS = ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS",
            "TPU_PROCESS_ADDRESSES", "TPU_PROCESS_PORT", "CLOUD_TPU_TASK_ID",
            "ALLOW_MULTIPLE_LIBTPU_LOAD")
GPU_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
# CUDA numbers GPUs fastest first unless told PCI_BUS_ID, the order the driver (NVML,
# nvidia-smi, the /dev/nvidiaN files) numbers them in: a GPU named by its file is GPU N only so
# (NVIDIA, CUDA C++ Programming Guide, "CUDA Environment Variables")
PCI_ORDER = "PCI_BUS_ID"
DEVICE_VARS = {"tpu": TPU_VARS, "gpu": GPU_VARS}

_NUMBERED = re.compile(r"(accel|nvidia|)(\d+)$")


def device_files(patterns) -> tuple:
    """The chip device files matching ``patterns`` (globs), one per chip, in chip order.

    Only numbered entries count (``/dev/accel3``, ``/dev/vfio/12``, ``/dev/nvidia0``):
    ``/dev/vfio/vfio`` and ``/dev/nvidiactl`` are the drivers' control files, not chips.
    """
    found = {}
    for pattern in patterns:
        for path in glob.glob(pattern):
            match = _NUMBERED.match(os.path.basename(path))
            if match:
                found[path] = (os.path.dirname(path), int(match.group(2)))
    return tuple(sorted(found, key=found.get))


def tpu_split(chips: int, num_processes: int, devices_per_process: int | None = None) -> str | None:
    """None when ``num_processes`` processes can share ``chips`` TPU chips, else why not and
    what would work (a sentence for the user).

    With ``devices_per_process`` (the user's setting, not None), the processes must also
    use every chip between them, and what would work names both settings.
    """
    works = [chips // per for per in sorted(TPU_SPLITS.get(chips, {}), reverse=True)]
    if devices_per_process is not None:
        if devices_per_process * num_processes == chips and tpu_split(chips, num_processes) is None:
            return None
        pers = ", ".join(str(chips // n) for n in [1] + works)
        options = ", ".join(str(n) for n in [1] + works)
        return (f"{devices_per_process} x {plural(num_processes, 'process')} is not a split of "
                f"this machine's {plural(chips, 'TPU chip')} that libtpu makes (it splits a host's "
                "chips only in known shapes, each process an equal share); use num_processes "
                f"{options} with devices_per_process {pers} respectively, or leave "
                "devices_per_process unset (each process gets its share)")
    if num_processes == 1:
        return None
    if num_processes > chips:
        why = f"more processes than the {plural(chips, 'TPU chip')} found"
    elif chips % num_processes or chips // num_processes not in TPU_SPLITS.get(chips, {}):
        why = (f"{plural(chips, 'TPU chip')} cannot be split among "
               f"{plural(num_processes, 'process')} (libtpu splits a host's chips only in known "
               "shapes)")
    else:
        return None
    options = ", ".join(str(n) for n in [1] + works)
    return f"{why}; use num_processes {options}"


def tpu_env(chips: int, num_processes: int, process_id: int, ports: tuple) -> dict:
    """libtpu's variables for ``process_id`` of ``num_processes`` sharing ``chips`` chips.

    Args:
      chips: TPU chips on this host (``device_files``'s count).
      num_processes: processes sharing them; ``tpu_split`` must have accepted the pair.
      process_id: this process's index, 0-based.
      ports: one free TCP port per process, for libtpu's own traffic between them
        (``TPU_PROCESS_ADDRESSES``); unused (may be empty) for one process.

    Returns:
      The variables to add to the worker's environment; empty for one process, which
      gets every chip as libtpu does by default (``TPU_VARS`` are then dropped from the
      environment it inherits).
    """
    if num_processes == 1:
        return {}
    per = chips // num_processes
    chip_bounds, process_bounds = TPU_SPLITS[chips][per]
    first = process_id * per
    return {
        "TPU_VISIBLE_CHIPS": ",".join(str(c) for c in range(first, first + per)),
        "TPU_CHIPS_PER_PROCESS_BOUNDS": chip_bounds,
        "TPU_PROCESS_BOUNDS": process_bounds,
        "TPU_PROCESS_ADDRESSES": ",".join(f"localhost:{p}" for p in ports),
        "TPU_PROCESS_PORT": str(ports[process_id]),
        "CLOUD_TPU_TASK_ID": str(process_id),
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }


def gpu_ids(files: tuple, given: str | None = None) -> tuple:
    """The GPUs a gpu run splits among its processes, as ``CUDA_VISIBLE_DEVICES`` names them.

    Args:
      files: the GPUs' device files (``device_files``: ``/dev/nvidia4``...), in order.
      given: the launching shell's ``CUDA_VISIBLE_DEVICES`` (a scheduler's allocation, or the
        user's choice), or None where it has none.

    Returns:
      ``given``'s entries as they are (indices or ``GPU-<uuid>``s: never widened to the
      machine's other GPUs), else each file's number (``nvidia4`` is ``4``), which is the
      driver's numbering of the GPUs, and CUDA's under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
    """
    if given is not None:
        return tuple(e.strip() for e in given.split(",") if e.strip())
    return tuple(_NUMBERED.match(os.path.basename(f)).group(2) for f in files)


def gpu_env(gpus: tuple, devices_per_process: int, process_id: int,
            order: str | None = PCI_ORDER) -> dict:
    """``CUDA_VISIBLE_DEVICES`` for ``process_id``: its own ``devices_per_process`` of ``gpus``
    (``gpu_ids``), the i-th process the i-th share, and ``CUDA_DEVICE_ORDER`` (``order``:
    PCI_BUS_ID for GPUs named by their files; the shell's own, or none, for its list)."""
    first = process_id * devices_per_process
    env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus[first:first + devices_per_process])}
    if order:
        env["CUDA_DEVICE_ORDER"] = order
    return env


def holders(paths, lockfile: str | None = None, unreadable_pids=None) -> tuple:
    """Processes that hold any of ``paths`` (device files) or ``lockfile`` open.

    Found by reading ``/proc/*/fd`` (never by name), as the tpu backend does on its hosts
    (``launcher.remote.holders``); this process is never one.

    Returns:
      ``(holders, unreadable)``: ``[(pid, command line, [paths held])]`` by pid, and how
      many processes' open files could not be read (another user's, without root).
      ``unreadable_pids`` (tests) are counted as such, never as holders.
    """
    real = {os.path.realpath(p) for p in paths}
    if lockfile:
        real.add(os.path.realpath(lockfile))
    found, unreadable = proctl.open_files(real, skip_pid=os.getpid())
    for pid in unreadable_pids or ():  # tests: another user's process, as /proc shows it
        if found.pop(pid, None) is not None or os.path.isdir(f"/proc/{pid}"):
            unreadable += 1
    return [(pid, proctl.cmdline(pid), sorted(held)) for pid, held in sorted(found.items())], \
        unreadable


def describe_holders(found: list) -> str:
    """``holders``' list as one sentence's worth: pid, command and the files it holds."""
    return "; ".join(f"pid {pid} ({printable(cmd) if cmd else '?'}) holds {', '.join(paths)}"
                     for pid, cmd, paths in found)


PLATFORMS = ("cpu", "tpu", "gpu")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalCluster(ClusterSettings):
    """Single-host mode: every process on this machine, on its CPU (the default, for debugging),
    its TPU chips or its GPUs (``platform``; ``launcher.backends.local.devices``)."""

    backend: Literal["local"] = setting(
        "local", doc="local (this machine), ssh (docs/ssh.md: hosts, users, keys, known_hosts, "
        "workdir, python, setup, sync), tpu (docs/tpu.md: TPU name or slices, zone, project) or "
        "slurm (docs/slurm.md: in an allocation or by submission; nodes, partition, time limit)")
    platform: Literal["cpu", "tpu", "gpu", "auto"] = setting(
        "cpu", doc="the devices the processes train on: cpu (CPU devices, the debug mode), tpu "
        "(this machine's TPU chips), gpu (its GPUs) or auto (what JAX would pick: TPU chips if "
        "any, else GPUs, else the CPU; docs/tpu.md#on-one-tpu-vm)")
    num_processes: int | None = setting(
        None, check=sections.in_range(1, 256),
        doc="worker processes to start; null: 2 on cpu, 1 on tpu (every chip), one per GPU on "
        "gpu, or on either the chips found divided by devices_per_process where that is set. On "
        "a TPU VM several processes split the chips only in the shapes libtpu knows: 4 "
        "chips 1, 2 or 4 processes, 8 chips 1, 2 or 8")
    devices_per_process: int | None = setting(
        None, check=sections.in_range(1, 256),
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


def check_chips_free(job, unreadable_pids=None) -> int:
    """Refuse to start while another process holds this machine's TPU chips (a GPU's tenants
    are the driver's to name: ``launcher.backends.local.nvml``).

    Args:
      job: the validated spec.
      unreadable_pids: for tests, pids to count as unreadable (another user's) whatever
        ``/proc`` lets this process read.

    Returns:
      How many processes' open files could not be read (another user's, without root):
      one of them may hold a chip unseen; 0 when a holder is found or none is unread.

    Raises:
      LaunchError: a holder lives (its pid, command and the files it holds are named;
        nothing is stopped or removed: libtpu's lock file goes with its holder).
    """
    cluster = job.cluster
    if not cluster.chips:
        return 0
    lockfile = cluster.libtpu_lockfile if cluster.resolved_platform == "tpu" else None
    found, unreadable = holders(cluster.chips, lockfile, unreadable_pids)
    if found:
        raise LaunchError(f"the {cluster.resolved_platform.upper()} is in use: "
                          f"{describe_holders(found)}; wait for it to end, or stop it "
                          f"(kill {' '.join(str(pid) for pid, _, _ in found)}), then launch again")
    return unreadable


def unchecked_text(job, unreadable: int) -> str:
    """The warning for ``unreadable`` processes ``check_chips_free`` could not check."""
    cluster = job.cluster
    files = " ".join(cluster.chips + ((cluster.libtpu_lockfile,)
                                      if cluster.resolved_platform == "tpu" else ()))
    return (f"warning: {plural(unreadable, 'process')} of other users could not be checked for "
            f"holding the {cluster.resolved_platform.upper()} (their open files are not readable "
            f"without root); if the run cannot get its chips, check with: sudo lsof {files}")
