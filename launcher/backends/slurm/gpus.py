"""A gpu job's GPUs on Slurm: every step asks for all of the job's on its node, each process
uses its own of them.

Each step of a ``platform: gpu`` job asks for ``gpus_per_node`` GPUs (``srun
--gres=gpu:N``, as the batch script asks for the job: ``workers.srun_argv``), whatever the
allocation's ``SLURM_GPUS_PER_TASK``/``SLURM_GPUS_PER_NODE``/``SLURM_TRES_PER_TASK`` say (those
are scrubbed from srun's environment: ``commands.scrubbed``). Slurm gives the step the first N
of the job's GPUs on the node and sets its ``CUDA_VISIBLE_DEVICES`` to them, so every process
of a node sees the same list, and each uses its ``local_device_ids`` of it (the plan's:
process rank r of the node takes entries r x devices_per_process onwards), passed to
``jax.distributed.initialize``. Slurm's ``CUDA_VISIBLE_DEVICES`` wins: it is the only list
right under every device constraint (with cgroup's ``ConstrainDevices`` Slurm numbers a step's
GPUs from 0, without it by their index on the node), so podlaunch never sets one and passes
none of the launcher's on (``UNSET``). It sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: CUDA numbers
GPUs fastest first otherwise, and Slurm numbers them as its gres.conf lists them (the
``/dev/nvidiaN`` files, or NVML's PCI bus order with ``AutoDetect=nvml``).

``scontrol -o -d show job`` names the job's GPUs on each node by Slurm's index
(``GRES=gpu:2(IDX:1-2)``): the dry run prints each process's by that index, and an allocation
with fewer than N on a node is refused before a step fails on it.
"""

from __future__ import annotations

import re

from launcher.plan import Placement
from launcher.words import plural

ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # every process of a gpu job
UNSET = ("CUDA_VISIBLE_DEVICES",)  # the launcher's is never passed on: Slurm sets the step's
# one GPU entry of a GRES=... value: gpu:2(IDX:1-2), gpu:a100:2(IDX:0,3)
_GPU_IDX = re.compile(r"(?:^|,)gpu(?::[^:(,]+)?:\d+\(IDX:([0-9,-]+)\)")


def gpu_indices(text: str) -> dict:
    """node -> the indices of the job's GPUs there, as Slurm numbers them (``IDX``), from
    ``scontrol -o -d show job``'s one line (its ``Nodes=... GRES=gpu:2(IDX:1-2)`` groups; a
    typed ``gpu:a100:2(IDX:0-1)`` too); a node of no group, or of a group without GPUs, is
    absent."""
    found: dict = {}
    nodes: list = []
    for token in text.split():
        key, _, value = token.partition("=")
        if key == "Nodes":
            nodes = _expand(value)
        elif key == "GRES" and nodes:
            for match in _GPU_IDX.finditer(value):
                for node in nodes:
                    found.setdefault(node, []).extend(_indices(match.group(1)))
    return {node: tuple(ids) for node, ids in found.items()}


def _indices(text: str) -> list:
    """``0-1,3`` -> [0, 1, 3]."""
    out = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        if first.isdigit():
            out += range(int(first), int(last or first) + 1) if (last or first).isdigit() else []
    return out


def _expand(nodelist: str) -> list:
    """A compressed node list (``n[1-2],gpu07``) expanded here, without ``scontrol show
    hostnames`` (one bracket group per name, as Slurm writes its node names)."""
    out = []
    for name in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*", nodelist):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", name)
        if not match:
            out.append(name)
            continue
        head, ranges, tail = match.groups()
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            width = len(first)
            for i in range(int(first), int(last or first) + 1):
                out.append(f"{head}{i:0{width}d}{tail}")
    return out


def placements(job, node: str, python: str, run_dir: str, job_path: str, env: dict,
               cwd: str | None) -> list:
    """One placement per process of ``node``: rank r's ``local_device_ids`` are entries
    r x devices_per_process onwards of the step's GPUs; ``CUDA_DEVICE_ORDER`` set, the
    launcher's ``CUDA_VISIBLE_DEVICES`` not passed on."""
    per = job.cluster.devices_per_process
    return [Placement(node, 1, job.local_device_count, "gpu", python, run_dir, job_path,
                      {**env, **ENV}, cwd=cwd, local_device_ids=tuple(range(r * per, (r + 1) * per)),
                      unset=UNSET)
            for r in range(job.cluster.processes_per_node)]


def check(slurm, cluster, job_id: str, nodes: list, mode: str, problem) -> dict:
    """node -> the job's GPUs there by Slurm's index (``Slurm.gpus``).

    Raises:
      SpecError (``problem``): in allocation mode (the user's job), a node of ``nodes`` with
        fewer than ``gpus_per_node`` (srun would refuse every step there: ``Invalid generic
        resource (gres) specification``). A job podlaunch submitted asked for them itself.
    """
    held = slurm.gpus(job_id)
    if mode != "allocation":
        return held
    short = [(n, held.get(n, ())) for n in nodes if len(held.get(n, ())) < cluster.gpus_per_node]
    if short:
        node, has = short[0]
        raise problem("devices_per_process", (
            f"{plural(cluster.processes_per_node, 'process')} per node x "
            f"{plural(cluster.devices_per_process, 'GPU')} need {cluster.gpus_per_node} GPUs on "
            f"every node; allocation {job_id} (SLURM_JOB_ID) holds {plural(len(has), 'GPU')} on "
            f"{node}" + (f" (Slurm's {','.join(map(str, has))})" if has else "")
            + f"; ask salloc for --gpus-per-node={cluster.gpus_per_node} (or --gpus-per-task "
            "with as many tasks per node), or lower cluster.processes_per_node or "
            "cluster.devices_per_process"))
    return held


def process_gpus(cluster, process, node_gpus: dict) -> tuple:
    """The GPUs ``process`` uses by Slurm's index on its node (its ``local_device_ids`` of the
    step's: the first ``gpus_per_node`` of the job's there), or () where Slurm has not named
    them (a dry run before submission)."""
    held = node_gpus.get(process.host, ())[:cluster.gpus_per_node]
    ids = process.local_device_ids or ()
    return tuple(held[i] for i in ids) if ids and max(ids) < len(held) else ()


def devices_text(cluster, process, node_gpus: dict) -> str:
    """The dry run's words for a gpu process's devices."""
    n = cluster.gpus_per_node
    text = (f"local_device_ids {','.join(map(str, process.local_device_ids))} of the step's "
            f"{n} GPUs (--gres=gpu:{n}; Slurm's CUDA_VISIBLE_DEVICES, in PCI bus order)")
    gpus = process_gpus(cluster, process, node_gpus)
    return text + (f" = GPU {','.join(map(str, gpus))} of {process.host} by Slurm's index"
                   if gpus else "")
