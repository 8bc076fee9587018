"""``launch JOB.yaml --rehearse``: a TPU pod's exact topology as local CPU processes.

One local process per TPU VM host of every slice, each with as many CPU
devices as JAX sees on that host (``launcher.tpu_topology``: a v4-32 slice is
4 processes x 4 devices), the same process ids and the same MEGASCALE values
(with 127.0.0.1 as slice 0 worker 0). Shape and batch errors then show up on a
laptop before anyone pays for the pod. Nothing asks gcloud: the spec's
``accelerator_type`` and slice count are the topology.

A backend like ``launcher.backends.local`` (prepare / describe_start / start).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from launcher import spec as specs
from launcher import tpu_topology
from launcher.backends import local
from launcher.backends import tpu
from launcher.errors import Problem, SpecError
from launcher.plan import Plan


@dataclasses.dataclass(frozen=True, kw_only=True)
class RehearsalCluster(specs.LocalCluster):
    """Single-host debug mode shaped like a TPU cluster; ``rehearsed`` is that cluster."""

    rehearsed: Any = None


def local_job(job: specs.JobSpec) -> specs.JobSpec:
    """The job on local CPU processes shaped like its TPU cluster.

    Raises:
      SpecError: the job's cluster is not a TPU cluster, the global batch does not
        divide over the pod's devices, or a user task is not importable here.
    """
    cluster = job.cluster
    if cluster.backend != "tpu":
        raise SpecError([Problem("--rehearse", None, "", "only applies to cluster.backend: tpu "
                                 f"(this job's is {cluster.backend}); remove the flag")])
    topology = tpu_topology.topology(cluster.accelerator_type)
    rehearsal = dataclasses.replace(job, cluster=RehearsalCluster(
        num_processes=cluster.num_processes_total, devices_per_process=topology.devices_per_host,
        grace_s=cluster.grace_s, rehearsed=cluster,
        # the hosts' PYTHONPATH names their directories, not this machine's
        env={k: v for k, v in cluster.env.items() if k != "PYTHONPATH"}))
    if job.train.global_batch_size % rehearsal.device_count:
        raise SpecError([Problem(job.source, None, "train.global_batch_size",
                                 f"{job.train.global_batch_size} does not divide over the "
                                 f"{rehearsal.device_count} devices of {cluster.slice_count} x "
                                 f"{cluster.accelerator_type}; use a multiple of {rehearsal.device_count}")])
    specs.check_task_importable(rehearsal)
    specs.check_fits_in_memory(rehearsal)  # the whole pod's data, on this one machine
    return rehearsal


def prepare(job: specs.JobSpec, run_dir: str, python: str, console=None, **_ignored) -> Plan:
    """Plan the rehearsal: the local plan plus each process's TPU slice environment."""
    plan = local.prepare(job, run_dir, python, console)
    cluster = job.cluster.rehearsed
    processes = tuple(dataclasses.replace(p, env={**p.env, **tpu.slice_env(cluster, p.process_id,
                                                                         "127.0.0.1")})
                      for p in plan.processes)
    return dataclasses.replace(plan, processes=processes)


def describe_start(plan: Plan) -> str:
    cluster = plan.job.cluster.rehearsed
    return (f"rehearsing {cluster.slice_count} x {cluster.accelerator_type} on this machine: "
            f"{plan.num_processes} processes (one per TPU host) x {plan.job.local_device_count} "
            f"CPU devices (one per JAX device of a host), coordinator {plan.coordinator_address}")


start = local.start
