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

import glob
import os
import re

from launcher import proctl
from launcher.errors import LaunchError
from launcher.console.lines import printable
from launcher.words import plural

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
