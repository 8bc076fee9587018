"""The plan: which process runs where, with which id, environment and command.

A backend says where processes go (``Placement``s, one per host, in process
order, and the coordinator's address); ``make_plan`` turns a spec plus
placements into every process's ``ProcessPlan``. It is a pure function: no
I/O, no live resource (connections stay in the backend's session), so it is
easy to test and to print with ``--dry-run``. Process ids are assigned here
and only here: dense, unique, in placement order (backends order placements
slice-major where slices exist, as JAX's TPU cluster detection does).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex

from launcher.words import plural
from worker import contract
from worker.contract import redact

MASK = redact.MASK


@dataclasses.dataclass(frozen=True)
class Placement:
    """The processes of one host.

    Attributes:
      host: the host's name as the user wrote it ("localhost" on this machine).
      num_processes: worker processes on this host.
      local_device_count: devices each of them must see.
      platform: ``cpu``, ``gpu`` or ``tpu``, the platform each must report.
      python: the interpreter that runs ``-m worker`` there.
      run_dir: the run directory as the workers there see it.
      job_path: the resolved job JSON as the workers there see it.
      env: extra environment for this host's workers (the user's ``cluster.env``
        and anything the backend adds, e.g. a TPU slice's MEGASCALE values).
      label_host: whether console labels name the host (``[p3 host-c]``).
      cwd: the directory a program job's processes start in (None: the backend's own, e.g.
        an ssh host's workdir, where the program's directory is synced).
      local_device_ids: the node's device indices its (one) process uses (Slurm GPU
        steps), or None: JAX's own choice.
      unset: variables its workers must not inherit from the launcher's environment (the
        local backend's chip variables, which it decides itself); ``env`` still sets them.
    """

    host: str
    num_processes: int
    local_device_count: int
    platform: str
    python: str
    run_dir: str
    job_path: str
    env: dict = dataclasses.field(default_factory=dict)
    label_host: bool = True
    cwd: str | None = None
    local_device_ids: tuple[int, ...] | None = None
    unset: tuple[str, ...] = ()


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
      label: the console prefix, ``p3`` or ``p3 host-c``.
      python: the host's interpreter (it runs the wrapper; argv[0] for the built-in worker).
      cwd: where the process starts (None: the backend's default directory).
      program: argv is the user's program (``job.program``; the kind's ``user_command``), not
        the built-in worker: an exit 0 without a last step counts as success unless it
        reported steps or ``program_num_steps`` is set.
      program_num_steps: ``program.num_steps``, the steps the program says it will report
        (None: it did not say); then an exit 0 before the last one is a failure, even
        before its first report (a process that left before joining).
      attempt, resume: which attempt this is and whether it restores a checkpoint
        (``for_attempt``; also in ``env``, where the worker reads them through
        ``contract.Identity``).
      local_device_ids, run_dir, unset: as its Placement's (the run directory as its host
        sees it).
    """

    process_id: int
    host: str
    local_device_count: int
    env: dict
    argv: tuple
    log_path: str
    label: str = ""
    python: str = ""
    cwd: str | None = None
    program: bool = False
    program_num_steps: int | None = None
    attempt: int = 0
    resume: bool = False
    local_device_ids: tuple[int, ...] | None = None
    run_dir: str = ""
    unset: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Plan:
    """Every process of one attempt, in process_id order, and where the run's files go."""

    job: object
    run_dir: str
    coordinator_address: str
    processes: tuple
    placements: tuple = ()

    @property
    def num_processes(self) -> int:
        return len(self.processes)

    @property
    def job_path(self) -> str:
        """The resolved job JSON on this machine (backends copy it where placements say)."""
        return os.path.join(self.run_dir, "job.json")

    def on_host(self, index: int) -> tuple:
        """The processes of placement ``index``, in process_id order."""
        first = sum(p.num_processes for p in self.placements[:index])
        return self.processes[first:first + self.placements[index].num_processes]


def masked(env: dict, explicit=()) -> dict:
    """A copy of ``env`` with secret values replaced by ``MASK`` (rule: ``worker.contract.redact``)."""
    return redact.masked(dict(env), explicit)


def log_path(run_dir: str, process_id: int, attempt: int = 0) -> str:
    """``logs/process-NNN.log`` for attempt 0, ``logs/attempt-N/process-NNN.log`` for restart N."""
    name = f"process-{process_id:03d}.log"
    if attempt == 0:
        return os.path.join(run_dir, "logs", name)
    return os.path.join(run_dir, "logs", f"attempt-{attempt}", name)


def output_path(run_dir: str, process_id: int, attempt: int = 0) -> str:
    """A detached run's worker's own output on its host (``output/attempt-N/process-NNN.out``):
    written there by the worker and its wrapper, read by whichever supervisor watches the
    run (``launcher.rundir.journal``), so nothing is lost while none does."""
    return os.path.join(run_dir, "output", f"attempt-{attempt}", f"process-{process_id:03d}.out")


def remote_run_name(run_dir: str) -> str:
    """The run's directory name on its hosts (``<workdir>/runs/<job>/<name>``): the local run
    directory's name, then 8 hex digits of a SHA-256 of its real path.

    Two runs whose local directories share a name (``--run-dir a/run`` and ``--run-dir b/run``)
    get two remote directories, so neither takes the other's workers for its own survivors,
    nor its checkpoints, local copies or pid records; every attempt and ``--resume`` of one run
    directory gets the same name (a run directory reached through another path to the same
    place too: the path is resolved first).
    """
    path = os.path.realpath(run_dir)
    digest = hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{os.path.basename(path)}-{digest}"


def in_job_directory(job_name: str, run_dir: str) -> bool:
    """Whether ``run_dir`` lies in the job's directory of the default layout: ``.../runs/<job>/<run>``
    (``launch`` without ``--run-dir``, its ``--resume``, or a ``--run-dir`` named so)."""
    parent = os.path.dirname(os.path.normpath(run_dir))
    return (os.path.basename(parent) == job_name
            and os.path.basename(os.path.dirname(parent)) == "runs")


def compilation_cache_dir(job, run_dir: str, placement: Placement) -> str | None:
    """JAX's persistent compilation cache as ``placement``'s workers see it, or None (none used).

    A run in the default layout (``runs/<job>/<run>``, decided on the local
    ``run_dir``) shares ``runs/<job>/compilation-cache`` with every other run of
    the job on that host (its ``<workdir>/runs/<job>/`` over ssh and tpu), so a
    re-run loads what an earlier run compiled; a run directory elsewhere
    (``--run-dir``) keeps its own ``<run dir>/compilation-cache``, which every
    attempt of the run shares. None for a program job (it runs its own JAX) and
    for ``train.compilation_cache: false``.
    """
    if not job.uses_compilation_cache:
        return None
    home = (os.path.dirname(os.path.normpath(placement.run_dir))
            if in_job_directory(job.name, run_dir) else placement.run_dir)
    return os.path.join(home, contract.COMPILATION_CACHE)


def worker_env(job, placement: Placement, coordinator_address: str, process_id: int,
               cache_dir: str | None = None) -> dict:
    """The environment a worker gets: platform variables, the contract, then the placement's env.

    Args:
      job: the validated spec.
      placement: the host the process runs on.
      coordinator_address: ``host:port``, identical for every process.
      process_id: this process's id.
      cache_dir: the compilation cache's directory there (``compilation_cache_dir``), or None.
    """
    env = {"PYTHONUNBUFFERED": "1"}
    if placement.platform == "cpu":
        # JAX reads these when its backends start, before initialize() returns.
        env["JAX_PLATFORMS"] = "cpu"
        env["JAX_NUM_CPU_DEVICES"] = str(placement.local_device_count)
    env.update(contract.Identity(
        coordinator_address=coordinator_address, num_processes=job.num_processes,
        process_id=process_id, local_device_count=placement.local_device_count,
        platform=placement.platform, job_path=placement.job_path,
        run_dir=placement.run_dir, compilation_cache_dir=cache_dir,
        local_device_ids=placement.local_device_ids).to_env())
    env.update(placement.env)
    env.update(job.environment(coordinator_address))  # a program's JAX_COORDINATOR_ADDRESS, env
    return env


def make_plan(job, placements, run_dir: str, coordinator_address: str) -> Plan:
    """Lay out every process: ids in placement order, each with its env, command and log.

    Args:
      job: the validated spec (``num_processes`` must equal the placements' total).
      placements: one per host, in process order.
      run_dir: absolute path of the local run directory (logs go there).
      coordinator_address: ``host:port`` of JAX's coordinator (placement 0's host).

    Returns:
      A Plan whose processes are ordered by process_id 0 .. num_processes-1.

    Raises:
      ValueError: the placements hold another number of processes than the spec.
    """
    placements = tuple(placements)
    total = sum(p.num_processes for p in placements)
    if total != job.num_processes:
        raise ValueError(f"placements hold {total} processes, the spec {job.num_processes}")
    processes = []
    for placement in placements:
        for _ in range(placement.num_processes):
            process_id = len(processes)
            label = f"p{process_id} {placement.host}" if placement.label_host else f"p{process_id}"
            processes.append(ProcessPlan(
                process_id=process_id, host=placement.host,
                local_device_count=placement.local_device_count,
                env=worker_env(job, placement, coordinator_address, process_id,
                               compilation_cache_dir(job, run_dir, placement)),
                argv=job.command(placement.python, run_dir, process_id),
                log_path=log_path(run_dir, process_id), label=label, python=placement.python,
                cwd=placement.cwd, program=job.user_command,
                program_num_steps=job.program_num_steps,
                local_device_ids=placement.local_device_ids, run_dir=placement.run_dir,
                unset=placement.unset))
    return Plan(job=job, run_dir=run_dir, coordinator_address=coordinator_address,
                processes=tuple(processes), placements=placements)


def process_ids(placements) -> list:
    """Per placement, the ids ``make_plan`` gives its processes (consecutive, in placement
    order), without building a plan (a plan per host costs an environment per process)."""
    ids, first = [], 0
    for placement in placements:
        ids.append(range(first, first + placement.num_processes))
        first += placement.num_processes
    return ids


def for_attempt(plan: Plan, attempt: int, resume: bool) -> Plan:
    """``plan`` with this attempt's log paths and its ``PODLAUNCH_ATTEMPT``/``RESUME`` env."""
    processes = tuple(dataclasses.replace(
        p, log_path=log_path(plan.run_dir, p.process_id, attempt), attempt=attempt, resume=resume,
        env={**p.env, contract.ATTEMPT: str(attempt), contract.RESUME: "1" if resume else "0"})
        for p in plan.processes)
    return dataclasses.replace(plan, processes=processes)


def devices_text(plan: Plan) -> str:
    """The run's devices in a few characters, for ``launch runs`` (run.json's ``devices``):
    ``num_processes x local_device_count`` and the platform, ``2x2 cpu``, ``1x4 tpu``; the
    total, ``6 gpu``, where processes see different counts."""
    counts = {p.local_device_count for p in plan.processes}
    platforms = "/".join(sorted({p.platform for p in plan.placements})) or "?"
    if len(counts) == 1:
        return f"{plan.num_processes}x{counts.pop()} {platforms}"
    return f"{sum(p.local_device_count for p in plan.processes)} {platforms}"


def restarts_text(policy) -> str:
    """What a failure of each class leads to (the ``restarts`` section), in one line."""
    budgets = (f"program errors {policy.program_errors}, infrastructure {policy.infrastructure}, "
               f"preemptions {policy.preemptions}, stalls {policy.stalls}")
    cap = "" if policy.max_restarts is None else f", at most {policy.max_restarts} in all"
    return f"restarts: {budgets}{cap} (backoff_s {policy.backoff_s:g})"


def describe(plan: Plan) -> str:
    """The ``--dry-run`` text: per process its host, id, env (secrets masked) and command."""
    job = plan.job
    lines = [
        f"job {job.name}: {plural(plan.num_processes, 'process')} x "
        f"{plural(job.local_device_count, 'device')} "
        f"= device_count {job.device_count}{job.batch_text}",
        *job.data_lines,
        f"coordinator_address {plan.coordinator_address}",
        f"run directory {plan.run_dir}",
        restarts_text(job.restarts),
    ]
    for process in plan.processes:
        env = masked(process.env, job.secrets)
        lines.append(f"{process.label}: host {process.host}, process_id {process.process_id}, "
                     f"{plural(process.local_device_count, 'device')}, log {process.log_path}"
                     + (f", in {process.cwd}" if process.cwd else ""))
        lines.append("  " + " ".join(["env"] + [f"{k}={shlex.quote(v)}" for k, v in env.items()]
                                     + [shlex.quote(a) for a in
                                        redact.masked_argv(process.argv, job.secrets)]))
    return "\n".join(lines)
