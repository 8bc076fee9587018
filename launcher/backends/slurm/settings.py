"""The ``cluster:`` settings of the slurm backend (checked by ``launcher.spec.schema``).

Importing this module runs no Slurm command; see docs/slurm.md.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from launcher.spec import schema
from worker.contract import valuechecks
from launcher.backends.base import ClusterSettings
from launcher.spec.schema import port_or_zero
from worker.contract.sections import setting
from worker.contract.valuechecks import non_negative, positive

# Slurm names (partition, account, QoS): no shell or #SBATCH metacharacters.
SLURM_NAME = valuechecks.identifier("a Slurm name", r"[A-Za-z0-9_][A-Za-z0-9_.+-]*",
                               "letters, digits and _ . + -, not starting with '-' or '.'",
                               r"[A-Za-z0-9_.+-]")
# sbatch --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED/INFINITE.
_TIME = re.compile(r"\d{1,9}(:\d{1,2}){0,2}|\d{1,5}-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE")


def time_limit_s(value: str) -> int | None:
    """A ``--time`` value in seconds (sbatch's forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM,
    D-HH:MM:SS); None for UNLIMITED, INFINITE or 0 (no limit, as sbatch reads it)."""
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, _, rest = value.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:  # MM, MM:SS, HH:MM:SS
        hours, minutes, seconds = ([0] * (3 - len(parts)) + parts if len(parts) == 3 else
                                   [0] + (parts + [0])[:2])
    total = ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    return total or None  # sbatch reads --time=0 as no limit


def time_limit(value: str) -> str | None:
    if _TIME.fullmatch(value):
        return None
    return (f"expected a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or "
            f"UNLIMITED), got {value!r}")


DEFAULT_LEAD_S = 120  # cluster.time_limit_lead_s unset: this, or half the limit when less

_OPTION = re.compile(r"--[a-z][a-z0-9-]*(=[A-Za-z0-9_./:,=@%+*\[\]-]+)?")
# What podlaunch writes itself: an extra line may not change the shape of the job.
OWN_OPTIONS = ("--nodes", "--ntasks", "--ntasks-per-node", "--tasks-per-node", "--cpus-per-task",
               "--gpus-per-task", "--gpus-per-node",
               "--gpus", "--gres", "--partition", "--time", "--account", "--qos", "--job-name",
               "--output", "--error", "--requeue", "--no-requeue", "--open-mode", "--wrap",
               "--test-only", "--parsable", "--chdir", "--signal")


# Options that change where or how many jobs run: podlaunch places, excludes and counts them.
PLACEMENT_OPTIONS = ("--exclude", "--nodelist", "--nodefile", "--array", "--wait")
# Options that change whether and when the job ends, which podlaunch follows and times itself.
LIFECYCLE_OPTIONS = {
    "--hold": "the job would wait for a release nobody gives",
    "--no-kill": "a node failure would no longer end the job, so podlaunch would not see it",
    "--time-min": "Slurm may shorten the time limit that the notice (--signal) is timed against",
}


def sbatch_options(values: tuple) -> str | None:
    """Extra ``#SBATCH`` lines: long options only, one token each, none podlaunch sets.

    sbatch reads a long option by any unambiguous abbreviation (getopt_long), so
    ``--signa=...`` is ``--signal``: a name that is a prefix of an option podlaunch sets is
    refused as that option."""
    for value in values:
        if not _OPTION.fullmatch(value):
            return (f"expected sbatch long options like '--constraint=a100' (one token, no spaces, "
                    f"quotes or line breaks), got {value!r}")
        name = value.split("=", 1)[0]
        own = [o for o in OWN_OPTIONS + PLACEMENT_OPTIONS + tuple(LIFECYCLE_OPTIONS)
               if o.startswith(name)]
        if name in own:  # an exact name is that option, not a prefix of longer ones
            own = [name]
        if not own:
            continue
        what = name if name in own else f"{name} (sbatch reads it as {' or '.join(own)})"
        if lifecycle := [LIFECYCLE_OPTIONS[o] for o in own if o in LIFECYCLE_OPTIONS]:
            return (f"{what} changes whether or when the job ends, which podlaunch follows "
                    f"itself: {lifecycle[0]}; remove {value!r}")
        if any(o in PLACEMENT_OPTIONS for o in own):
            return (f"{what} changes where the job runs, which podlaunch decides itself (a "
                    "resubmission excludes a failed node: docs/slurm.md); use "
                    "cluster.partition or '--constraint=...' to choose nodes instead of "
                    f"{value!r}")
        return (f"{what} is set by podlaunch from the cluster settings (nodes, "
                "processes_per_node, devices_per_process, partition, time_limit, time_limit_lead_s, "
                f"account, qos, requeue); use those keys instead of {value!r}")
    return None


# Read by srun from its environment as its own options (SLURM_GPUS_PER_TASK is
# --gpus-per-task, SLURM_NTASKS --ntasks): podlaunch gives each step its shape itself, and an
# inherited one is scrubbed (``commands.scrubbed``), so cluster.env may not set one either.
SRUN_INPUT_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_")
# What gives a gpu step's process its GPUs: Slurm's CUDA_VISIBLE_DEVICES (the step's --gres),
# read in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID, podlaunch's): ``gpus``
GPU_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


# What only a job podlaunch submits reads (sbatch's options).
SUBMIT_ONLY = ("time_limit", "time_limit_lead_s", "partition", "account", "qos", "sbatch_options")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SlurmCluster(ClusterSettings):
    """A Slurm cluster: inside an allocation (salloc, sbatch) or a job podlaunch submits."""

    backend: Literal["slurm"] = setting("slurm", doc="local, ssh, tpu or slurm")
    mode: Literal["auto", "allocation", "submit"] = setting(
        "auto", doc="allocation: run in the Slurm job of SLURM_JOB_ID (salloc/sbatch); submit: "
        "sbatch a job and run in it; auto: allocation when SLURM_JOB_ID is set, else submit")
    nodes: int = setting(1, check=valuechecks.in_range(1, 100000), doc="nodes of the job")
    processes_per_node: int = setting(1, check=valuechecks.in_range(1, 256),
                                      doc="worker processes (Slurm tasks) per node")
    devices_per_process: int = setting(1, check=valuechecks.in_range(1, 256),
                                       doc="devices each process sees (CPU devices, or GPUs)")
    platform: Literal["cpu", "gpu"] = setting(
        "cpu", doc="cpu: JAX_NUM_CPU_DEVICES per process; gpu: the job and each step ask for "
        "processes_per_node x devices_per_process GPUs per node (--gres=gpu:N, whatever the "
        "allocation's SLURM_GPUS_* say) and each process gets its local_device_ids of them")
    cpus_per_process: int | None = setting(None, check=valuechecks.in_range(1, 4096),
                                           doc="--cpus-per-task; unset: the site's default")
    partition: str | None = setting(None, check=SLURM_NAME, doc="partition; unset: the default one")
    time_limit: str | None = setting(None, check=time_limit, doc="--time, e.g. 02:00:00")
    time_limit_lead_s: int | None = setting(
        None, check=valuechecks.in_range(0, 65535),
        doc="with time_limit: --signal=TERM@N, so Slurm SIGTERMs every task about N s before "
        "the limit (up to 60 s earlier) and every process saves one agreed step; unset: "
        f"{DEFAULT_LEAD_S} s, or half the time limit when that is less; 0: no lead (the "
        "SIGTERM comes at the limit, KillWait before the SIGKILL)")
    account: str | None = setting(None, check=SLURM_NAME, doc="--account")
    qos: str | None = setting(None, check=SLURM_NAME, doc="--qos")
    sbatch_options: tuple[str, ...] = setting((), check=sbatch_options,
                                              doc="extra #SBATCH lines, e.g. ['--constraint=a100']")
    requeue: bool = setting(True, doc="--requeue: a preempted job goes back to the queue and "
                            "podlaunch resumes it from the latest checkpoint")
    python: str | None = setting(None, check=schema.COMMAND,
                                 doc="interpreter on the nodes; unset: this launcher's (shared filesystem)")
    workdir: str | None = setting(None, check=schema.REMOTE_PATH,
                                  doc="directory the workers start in; unset: the launcher's (a program "
                                  "job starts in its program.dir)")
    coordinator_port: int = setting(0, check=port_or_zero,
                                    doc="JAX coordinator port on the first node; 0 picks a free one there")
    poll_s: float = setting(1.0, check=positive, doc="seconds between queue checks while pending")
    orphan_timeout_s: int = setting(600, check=valuechecks.in_range(30, valuechecks.NUMBER_MAX),
                                    doc="a submitted job ends itself when its launcher has been "
                                    "silent this long (killed with SIGKILL, host lost); a detached "
                                    "run's, once no step of the run is left either")
    grace_s: float = setting(3.0, check=non_negative, doc="after SIGTERM, wait this long before SIGKILL")
    env: dict[str, schema.EnvValue] = setting({}, check=schema.env_names,
                                              doc="extra environment for every worker")

    @property
    def num_processes_total(self) -> int:
        return self.nodes * self.processes_per_node

    @property
    def gpus_per_node(self) -> int:
        """The GPUs a gpu job asks for on each node (``--gres=gpu:N``, the job's and every
        step's): ``processes_per_node`` x ``devices_per_process``; 0 on cpu."""
        return self.processes_per_node * self.devices_per_process if self.platform == "gpu" else 0

    @property
    def signal_lead_s(self) -> int:
        """The ``--signal=TERM@N`` lead the submitted job asks for, in seconds: with a
        finite ``time_limit``, ``time_limit_lead_s`` (unset: ``DEFAULT_LEAD_S``, at most half
        the limit); else 0 (none asked)."""
        limit_s = time_limit_s(self.time_limit) if self.time_limit else None
        if limit_s is None:
            return 0
        if self.time_limit_lead_s is None:
            return min(DEFAULT_LEAD_S, limit_s // 2)
        return self.time_limit_lead_s

    def submit_only(self) -> list:
        """The settings of a job podlaunch submits that are set here, by key: ``mode:
        allocation`` (or ``auto`` inside one) runs in the user's job and uses none of them."""
        return [key for key in SUBMIT_ONLY if getattr(self, key) not in (None, ())]

    def problems(self) -> list:
        """A lead without a finite time limit, or one that is not under it; a setting of a
        submitted job with ``mode: allocation``; ``env`` setting a variable srun reads as its
        own option, or (gpu) one that gives a process its GPUs."""
        for name in self.env:
            if name.startswith(SRUN_INPUT_PREFIXES):
                return [(("env", name), f"{name!r} would be read by srun as one of its own options "
                         "(SLURM_GPUS_PER_TASK is --gpus-per-task) and reshape every step; podlaunch "
                         "gives each step its shape from the cluster settings (nodes, "
                         "processes_per_node, devices_per_process, cpus_per_process): remove it")]
            if self.platform == "gpu" and name in GPU_VARS:
                return [(("env", name), f"{name!r} is not yours to set on a gpu job: Slurm sets "
                         "CUDA_VISIBLE_DEVICES for each step (its GPUs on the node, --gres) and "
                         "podlaunch sets CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers them as "
                         "Slurm does; each process then uses its own by local_device_ids. Remove "
                         "it, and choose the split with cluster.processes_per_node and "
                         "cluster.devices_per_process")]
        if self.mode == "allocation" and (unused := self.submit_only()):
            key = unused[0]
            return [(key, f"is for a job podlaunch submits, and mode: allocation runs in your "
                     "own job (salloc/sbatch set its time limit, partition and account): remove "
                     f"cluster.{key}, or use mode: submit")]
        lead = self.time_limit_lead_s
        if lead is None:
            return []
        limit_s = time_limit_s(self.time_limit) if self.time_limit else None
        if limit_s is None:
            if not lead:
                return []
            return [("time_limit_lead_s", f"{lead} s is a lead before cluster.time_limit, which is "
                     f"{'unset' if self.time_limit is None else self.time_limit}: set a finite "
                     "time_limit or remove time_limit_lead_s")]
        if lead > limit_s // 2:
            return [("time_limit_lead_s", f"{lead} s is more than half of cluster.time_limit "
                     f"{self.time_limit} ({limit_s} s): the notice would come before most of the "
                     f"job trains (Slurm sends it up to 60 s earlier still); use at most "
                     f"{limit_s // 2} or raise time_limit")]
        return []
