"""``launch JOB.yaml --rehearse``: a TPU pod's exact topology as local CPU processes.

One local process per TPU VM host of every slice, each with as many CPU
devices as JAX sees on that host (``launcher.tpu_topology``: a v4-32 slice is
4 processes x 4 devices), the same process ids and the same MEGASCALE values
(with 127.0.0.1 as slice 0 worker 0). Shape and batch errors then show up on a
laptop before anyone pays for the pod. Nothing asks gcloud: the spec's
``accelerator_type`` and slice count are the topology.

A backend of its own, chosen by ``TpuBackend.rehearsal``; the job is not
rewritten: its TPU cluster settings are read as they are.
"""

from __future__ import annotations

import os

from launcher.spec import checks
from launcher.backends import local
from launcher.backends.base import Backend, Options, Session
from launcher.backends.tpu.settings import TpuCluster, slice_env
from launcher.plan import Plan
from launcher.words import plural


class RehearsalSession(Session):
    def prepare(self, restart: bool = False) -> tuple[tuple, str]:
        job, cluster = self.job, self.job.cluster
        # the hosts' PYTHONPATH names their directories, not this machine's
        env = {k: v for k, v in cluster.env.items() if k != "PYTHONPATH"}
        placements = tuple(
            local.local_placement(job, self.run_dir, self.options.python, 1,
                                  cluster.devices_per_process,
                                  {**env, **slice_env(cluster, process_id, local.HOST)})
            for process_id in range(cluster.num_processes_total))
        return placements, f"{local.HOST}:{local.coordinator_port(job)}"

    def describe_start(self, plan: Plan) -> str:
        cluster = plan.job.cluster
        return (f"rehearsing {cluster.slice_count} x {cluster.accelerator_type} on this machine: "
                f"{plural(plan.num_processes, 'process')} (one per TPU host) x {plan.job.local_device_count} "
                f"CPU devices (one per JAX device of a host), coordinator {plan.coordinator_address}")

    def start(self, plan: Plan) -> list:
        return local.start_all(plan)


class RehearsalBackend(Backend):
    name = "tpu-rehearsal"
    cluster_type = TpuCluster

    def check(self, job, options: Options) -> None:
        # the hosts' PYTHONPATH names their directories: the rehearsal drops it
        checks.check_task_importable(job, os.environ.get("PYTHONPATH"))
        checks.check_worker_is_podlaunchs(job, os.environ.get("PYTHONPATH"))
        checks.check_fits_in_memory(job)  # the whole pod's data, on this one machine

    def session(self, job, run_dir: str, console=None, options: Options | None = None) -> Session:
        return RehearsalSession(job, run_dir, console, options)
