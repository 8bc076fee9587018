"""Single-host debug mode: every process is a subprocess of the launcher.

The smallest backend, and the one docs/backends.md walks through. Each
worker runs under the same wrapper as on SSH hosts (``launcher.remote.wrapper``)
and leads its own session (so its process group can be signalled as a
whole, and a Ctrl-C in the terminal reaches only the launcher, which then
tears down in order). The wrapper dies with the launcher (PR_SET_PDEATHSIG)
and is the subreaper of everything the worker starts, so even a SIGKILLed
launcher leaves no worker, and no helper a worker started, behind. A detached
run's wrappers are the exception (``launcher.backends.local.worker.LocalWorker`` with ``out_path``):
they outlive a killed supervisor, and ``launch attach`` takes them back
(``launcher.backends.local.adopt``).
"""

from __future__ import annotations

import errno
import os

from launcher import ports, proctl
from launcher.backends.local import adopt as localadopt, devices as localdevices, nvml
from launcher.backends.local.settings import LocalCluster
from launcher.spec import checks
from launcher.backends.base import Backend, Options, Session
from launcher.backends.local.worker import HOST, start_all
from launcher.errors import LaunchError, Problem, SpecError
from launcher.plan import Placement, Plan
from launcher.words import plural


def free_ports(count: int, host: str, taken=()) -> tuple:
    """``count`` distinct TCP ports, each as ``proctl.free_port`` picks one, none in ``taken``.

    Each port is free only a moment ago, and two calls may pick the same one: a plan that
    gives each of its processes a port (libtpu's ``TPU_PROCESS_PORT``, beside the
    coordinator's) asks here, and a port already picked is picked again.

    Raises:
      OSError: no TCP socket can be opened here at all, or ``count`` distinct free ports
        could not be found.
    """
    picked, exclude = [], set(taken)
    for _ in range(count * 64):
        if len(picked) == count:
            break
        port = proctl.free_port(host)
        if port not in exclude:
            picked.append(port)
            exclude.add(port)
    if len(picked) < count:
        raise OSError(errno.EADDRINUSE, f"no {count} distinct free TCP ports found")
    return tuple(picked)


def coordinator_port(job, taken=()) -> int:
    """The spec's coordinator port, checked free on 127.0.0.1, or a free one for 0 (none of
    ``taken``: the ports of a TPU split, picked before); either checked reachable from here.

    Raises:
      SpecError: the spec's fixed port is in use, or refused by bind (named where it was set:
        file and line, ``--set``, or the ``--cluster`` file).
      LaunchError: no TCP socket can be opened here (a sandbox, a locked-down host), or
        127.0.0.1 cannot be reached (the loopback interface down).
    """
    what = f"the JAX coordinator of a job of {plural(job.num_processes, 'process')}"
    port = job.cluster.coordinator_port or 0
    try:
        error = None if port == 0 else proctl.bind_error(port, HOST)
        port = port or free_ports(1, HOST, taken)[0]
    except OSError as exc:
        raise LaunchError(ports.no_socket(what, HOST, exc, ONE_PROCESS)) from None
    if error is not None:
        raise SpecError([Problem(*job.where(("cluster", "coordinator_port")),
                                 "cluster.coordinator_port",
                                 f"{error} on {HOST}; pick another or use 0")])
    ports.check_reachable(what, HOST, port, ONE_PROCESS)
    return port


ONE_PROCESS = "a job of one process needs none (cluster.num_processes: 1)"


def coordinator_address(job, taken=()) -> str:
    """``host:port`` of the coordinator, or ``127.0.0.1:0`` where nothing joins one.

    A trainer job of one process joins no ``jax.distributed``
    (``worker.runtime.joining.single_process``) and so opens no socket: nothing is picked,
    nothing listens (a ``cluster.coordinator_port`` is unused), a machine without TCP runs it.
    A program of one process gets a port, as a program may call ``jax.distributed.initialize``
    itself; on a machine that allows no TCP socket it gets none (``podlaunch.program``'s
    ``initialize`` joins nothing for one process), as no coordinator could run there anyway.
    ``taken``: ports the coordinator's must differ from (a TPU split's).
    """
    if not job.needs_coordinator:
        return f"{HOST}:0"
    try:
        return f"{HOST}:{coordinator_port(job, taken)}"
    except LaunchError:
        if job.num_processes == 1:
            return f"{HOST}:0"
        raise


def local_placement(job, run_dir: str, python: str, num_processes: int,
                    local_device_count: int, env: dict, platform: str = "cpu") -> Placement:
    """``num_processes`` on this machine with ``local_device_count`` devices of ``platform``;
    on tpu or gpu the variables that give a process its chips (``localdevices.DEVICE_VARS``)
    and ``JAX_PLATFORMS`` are the launcher's alone: those this shell exported are not
    inherited."""
    return Placement(host="localhost", num_processes=num_processes,
                     local_device_count=local_device_count, platform=platform, python=python,
                     run_dir=run_dir, job_path=os.path.join(run_dir, "job.json"), env=env,
                     label_host=False, cwd=job.working_directory,
                     unset=localdevices.DEVICE_VARS[platform] + ("JAX_PLATFORMS",)
                     if platform in localdevices.DEVICE_VARS else ())


def placements(job, run_dir: str, python: str, platform: str, taken_ports=()) -> tuple:
    """Every process's placement on this machine: one for all of them on the CPU or on every
    TPU chip, one per process where each gets its own TPU chips (libtpu's variables) or GPUs
    (``CUDA_VISIBLE_DEVICES``, set even for one process: it may have fewer than all).

    Args:
      taken_ports: ports this plan uses already (a fixed ``coordinator_port``); a TPU
        split's ports are distinct from them and from each other.

    Raises:
      LaunchError: a TPU split needs a port per process and no TCP socket can be opened.
    """
    cluster, n, devices = job.cluster, job.num_processes, job.local_device_count
    env = dict(cluster.env)
    # a JAX_PLATFORMS=cpu this shell exported must not hide the chips: tpu is named; on gpu
    # JAX picks the GPUs itself (its "gpu" would also demand ROCm's plugin on a CUDA box)
    if platform == "tpu":
        env = {"JAX_PLATFORMS": "tpu", **env}
    if platform == "cpu" or (platform == "tpu" and n == 1):
        return (local_placement(job, run_dir, python, n, devices, env, platform),)
    if platform == "tpu":
        try:
            split = free_ports(n, HOST, taken_ports)
        except OSError as exc:
            raise LaunchError(ports.no_socket("libtpu, to split the chips among processes,", HOST,
                                              exc, ONE_PROCESS)) from None
        chips = len(cluster.chips)
        return tuple(local_placement(job, run_dir, python, 1, devices,
                                     {**localdevices.tpu_env(chips, n, i, split), **env}, platform)
                     for i in range(n))
    return tuple(local_placement(job, run_dir, python, 1, devices,
                                 {**localdevices.gpu_env(cluster.gpus, devices, i,
                                                         cluster.gpu_order), **env}, platform)
                 for i in range(n))


class LocalSession(Session):
    def __init__(self, job, run_dir: str, console=None, options: Options | None = None):
        super().__init__(job, run_dir, console, options)
        self.reattach = localadopt.LocalReattach(run_dir)

    def prepare(self, restart: bool = False) -> tuple[tuple, str]:
        job = self.job
        platform = self.platform()
        # the dry run names a holder too: the run would be refused; processes taken back
        # (launch attach) hold the chips themselves
        if platform == "gpu" and (restart or not self.options.adopting):
            for note in nvml.notes(job.cluster.gpus):  # the driver's tenants, not file holders
                self.console.say(note)
        elif platform != "cpu" and (restart or not self.options.adopting):
            unreadable = localdevices.check_chips_free(job)
            if unreadable:
                self.console.say(localdevices.unchecked_text(job, unreadable))
        # every port of the plan distinct: the split's, then the coordinator's apart from them
        found = placements(job, self.run_dir, self.options.python, platform,
                           taken_ports=(job.cluster.coordinator_port,)
                           if job.cluster.coordinator_port else ())
        split = [int(p.env["TPU_PROCESS_PORT"]) for p in found if "TPU_PROCESS_PORT" in p.env]
        return found, coordinator_address(job, taken=split)

    def platform(self) -> str:
        return self.job.cluster.resolved_platform

    def describe(self, plan: Plan) -> str:
        """The plan, after a line on the devices: which and how many chips this machine has
        (read from their device files, JAX not started) and what each process gets."""
        return self.devices_text(plan) + "\n" + super().describe(plan)

    def devices_text(self, plan: Plan) -> str:
        cluster, platform = self.job.cluster, self.platform()
        each = plural(self.job.local_device_count, "device")
        if cluster.resolved_platform == "cpu":
            return f"devices: CPU, {each} per process (JAX_NUM_CPU_DEVICES)"
        name = "TPU chip" if cluster.resolved_platform == "tpu" else "GPU"
        found = cluster.devices_found_text
        if cluster.resolved_platform == "gpu":
            named, _ = nvml.gpus()
            if named:  # as the driver names them: index, model and UUID
                found += "; " + ", ".join(nvml.described(g) for g in nvml.used(named, cluster.gpus))
        if platform == "cpu":
            return f"devices: {found}; rehearsed on CPU devices, {each} per process"
        if self.job.num_processes == 1 and self.job.local_device_count == cluster.device_count:
            return f"devices: {found}; one process gets every one"
        return f"devices: {found}; {plural(self.job.local_device_count, name)} per process"

    def describe_start(self, plan: Plan) -> str:
        cluster, platform = self.job.cluster, self.platform()
        each = plural(plan.job.local_device_count, f"{platform.upper()} device"
                      if platform != "cpu" else "CPU device")
        chips = (f"{plural(len(cluster.chips), 'TPU chip' if cluster.resolved_platform == 'tpu' else 'GPU')} "
                 "found on this machine")
        if cluster.resolved_platform == "cpu":
            mode = "single-host debug mode"
        elif platform == "cpu":
            mode = f"rehearsal on CPU devices of a {cluster.resolved_platform} run; {chips}"
        else:
            mode = chips
        if plan.job.num_processes == 1 and plan.coordinator_address.endswith(":0"):
            where = "no coordinator (one process" + (
                f"; cluster.coordinator_port {cluster.coordinator_port} unused)"
                if cluster.coordinator_port else ")")
        else:
            where = f"coordinator {plan.coordinator_address}"
        return f"starting {plural(plan.num_processes, 'process')} x {each} ({mode}), {where}"

    def start(self, plan: Plan) -> list:
        return start_all(plan, self.job.cluster.grace_s, self.options.detached)


class RehearsalSession(LocalSession):
    """``--rehearse`` of a tpu or gpu split: the same processes and devices, on CPU devices."""

    def platform(self) -> str:
        return "cpu"


class LocalBackend(Backend):
    name = "local"
    cluster_type = LocalCluster
    docs = ("docs/settings.md",)
    rehearses = "local with cluster.platform tpu or gpu"

    def check(self, job, options: Options) -> None:
        checks.check_task_importable(job)
        checks.check_program_found(job)
        checks.check_worker_is_podlaunchs(job)
        checks.check_fits_in_memory(job)

    def session(self, job, run_dir: str, console=None, options: Options | None = None) -> Session:
        return LocalSession(job, run_dir, console, options)

    def rehearsal(self, job) -> Backend | None:
        """A tpu or gpu split's processes and devices, on CPU devices (``--rehearse``).

        None where the job already runs on the CPU.
        """
        if job.cluster.resolved_platform == "cpu":
            return None
        return LocalRehearsal()


class LocalRehearsal(LocalBackend):
    name = "local-rehearsal"

    def session(self, job, run_dir: str, console=None, options: Options | None = None) -> Session:
        return RehearsalSession(job, run_dir, console, options)
