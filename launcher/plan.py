"""The plan: which process runs where, with which id, env and command.

``make_plan`` is a pure function of the spec and a few launch-time facts
(run directory, coordinator port, python path): no I/O, easy to test and to
print with ``--dry-run``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex

from launcher.spec import JobSpec
from worker import contract

_SECRET = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|API_?KEY|CREDENTIAL|PRIVATE|AUTH", re.I)
MASK = "****"


@dataclasses.dataclass(frozen=True)
class ProcessPlan:
    """One worker process.

    Attributes:
      process_id: JAX ``process_id``, 0 .. num_processes-1.
      host: where it runs ("localhost" in single-host debug mode).
      local_device_count: devices this process is expected to see.
      env: variables added to the worker's environment (contract + platform + user).
      argv: the command, argv[0] being the python interpreter.
      log_path: the launcher-side log file of this process's output.
    """

    process_id: int
    host: str
    local_device_count: int
    env: dict
    argv: tuple
    log_path: str

    @property
    def label(self) -> str:
        return f"p{self.process_id}" if self.host == "localhost" else f"p{self.process_id} {self.host}"


@dataclasses.dataclass(frozen=True)
class Plan:
    job: JobSpec
    run_dir: str
    coordinator_address: str
    processes: tuple

    @property
    def num_processes(self) -> int:
        return len(self.processes)

    @property
    def job_path(self) -> str:
        return os.path.join(self.run_dir, "job.json")


def is_secret(name: str) -> bool:
    """Whether an environment variable's value must never be printed."""
    return bool(_SECRET.search(name))


def masked(env: dict) -> dict:
    """A copy of ``env`` with secret values replaced by ``MASK``."""
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def log_path(run_dir: str, process_id: int, attempt: int = 0) -> str:
    """``logs/process-NNN.log`` for attempt 0, ``logs/attempt-N/process-NNN.log`` for restart N."""
    name = f"process-{process_id:03d}.log"
    if attempt == 0:
        return os.path.join(run_dir, "logs", name)
    return os.path.join(run_dir, "logs", f"attempt-{attempt}", name)


def worker_env(job: JobSpec, run_dir: str, coordinator_address: str, process_id: int,
               job_path: str) -> dict:
    """The environment every backend gives a worker: the contract, then the user's env.

    Args:
      job: the validated spec.
      run_dir: the run directory as the worker will see it (remote for ssh).
      coordinator_address: ``host:port``, identical for every process.
      process_id: this process's id.
      job_path: path of the resolved job JSON as the worker will see it.
    """
    cluster = job.cluster
    env = {"PYTHONUNBUFFERED": "1"}
    if cluster.platform == "cpu":
        # JAX reads these when its backends start, before initialize() returns.
        env["JAX_PLATFORMS"] = "cpu"
        env["JAX_NUM_CPU_DEVICES"] = str(job.local_device_count)
    env.update(contract.Identity(
        coordinator_address=coordinator_address, num_processes=job.num_processes,
        process_id=process_id, local_device_count=job.local_device_count,
        platform=cluster.platform, job_path=job_path, run_dir=run_dir).to_env())
    env.update(cluster.env)
    return env


def make_plan(job: JobSpec, run_dir: str, coordinator_port: int, python: str) -> Plan:
    """Lay out every process of a single-host debug run (``cluster.backend: local``).

    Args:
      job: the validated spec.
      run_dir: absolute path of the run directory.
      coordinator_port: TCP port of JAX's coordinator on 127.0.0.1 (already chosen).
      python: interpreter that runs ``-m worker``.

    Returns:
      A Plan whose processes are ordered by process_id.
    """
    coordinator_address = f"127.0.0.1:{coordinator_port}"
    job_path = os.path.join(run_dir, "job.json")
    processes = tuple(
        ProcessPlan(process_id=process_id, host="localhost",
                    local_device_count=job.local_device_count,
                    env=worker_env(job, run_dir, coordinator_address, process_id, job_path),
                    argv=(python, "-m", "worker"), log_path=log_path(run_dir, process_id))
        for process_id in range(job.num_processes))
    return Plan(job=job, run_dir=run_dir, coordinator_address=coordinator_address,
                processes=processes)


def describe(plan: Plan) -> str:
    """The ``--dry-run`` text: per process its host, id, env (secrets masked) and command."""
    job = plan.job
    lines = [
        f"job {job.name}: {plan.num_processes} processes x {job.local_device_count} devices "
        f"= device_count {job.device_count}; global_batch_size {job.train.global_batch_size} "
        f"= {job.per_device_batch_size} per device",
        f"coordinator_address {plan.coordinator_address}",
        f"run directory {plan.run_dir}",
    ]
    for process in plan.processes:
        env = masked(process.env)
        lines.append(f"{process.label}: host {process.host}, process_id {process.process_id}, "
                     f"{process.local_device_count} devices, log {process.log_path}")
        lines.append("  " + " ".join(["env"] + [f"{k}={shlex.quote(v)}" for k, v in env.items()]
                                     + [shlex.quote(a) for a in process.argv]))
    return "\n".join(lines)
