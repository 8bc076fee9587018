"""Single-host debug mode: every process is a subprocess of the launcher.

The smallest backend, and the one docs/backends.md walks through. Each
worker runs under the same wrapper as on SSH hosts (``launcher.remote.wrapper``)
and leads its own session (so its process group can be signalled as a
whole, and a Ctrl-C in the terminal reaches only the launcher, which then
tears down in order). The wrapper dies with the launcher (PR_SET_PDEATHSIG)
and is the subreaper of everything the worker starts, so even a SIGKILLed
launcher leaves no worker, and no helper a worker started, behind.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import threading
import time
from typing import Iterator

from launcher import proctl, remote
from launcher.backends import localdevices
from launcher.backends.localdevices import LocalCluster
from launcher.spec import checks
from launcher.backends.base import Backend, Options, Session
from launcher.errors import LaunchError, Problem, SpecError
from launcher.plan import Placement, Plan, ProcessPlan
from launcher.remote import wrapper
from launcher.state import Exit, exit_of
from launcher.words import plural
from worker import interrupts, profiling

HOST = "127.0.0.1"


class LocalWorker:
    """A worker process on this machine, under ``launcher.remote.wrapper`` as over SSH.

    The wrapper (a child subreaper that dies with the launcher, PR_SET_PDEATHSIG)
    starts the worker as the leader of its own session and, when the worker ends,
    is stopped or the launcher dies, kills every descendant the worker left, even
    those that left its process group. The worker's environment reaches the
    wrapper on stdin, never in a command line, with the wrapper's control token
    (``wrapper.TOKEN_VAR``). Teardown signals the worker's process group directly
    once the wrapper reported it (``PGID_MARK`` with that token) and the group is
    verified to be the wrapper's own child (``_own_group``).
    """

    def __init__(self, plan: ProcessPlan, grace_s: float = 3.0):
        self.plan = plan
        self.pgid: int | None = None
        self._reported: str | None = None
        self._eof = threading.Event()
        self._token = secrets.token_hex(16)
        argv = remote.module_call(plan.python or plan.argv[0], "wrapper", {
            "argv": list(plan.argv), "cwd": plan.cwd, "pid_file": None, "run_dir": plan.run_dir or ".",
            "process_id": plan.process_id, "grace_s": grace_s, "parent_pid": os.getpid(),
            "env_from_stdin": True})
        try:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, text=True, encoding="utf-8", errors="replace", bufsize=1)
        except OSError as exc:
            raise LaunchError(f"cannot start process_id {plan.process_id}: {plan.argv[0]}: "
                              f"{exc.strerror}") from None
        try:
            self._proc.stdin.write(json.dumps({**plan.env, wrapper.TOKEN_VAR: self._token}))
            self._proc.stdin.close()
        except OSError:  # it died at once: poll reports how
            pass

    @property
    def pid(self) -> int:
        """The wrapper's pid."""
        return self._proc.pid

    def lines(self) -> Iterator[str]:
        try:
            for line in self._proc.stdout:
                kind, payload, head = wrapper.control(line.rstrip("\n"), self._token)
                if kind == "pgid":
                    self.pgid = self._own_group(payload)
                elif kind == "exit":
                    self._reported = payload
                if head:
                    yield head
            self._proc.stdout.close()
        finally:
            self._eof.set()

    def _own_group(self, payload: str) -> int | None:
        """The reported pgid if it is the wrapper's child and leads its own group, else None
        (then teardown goes through the wrapper: nothing else is ever signalled)."""
        try:
            pgid = int(payload)
        except ValueError:
            return None
        fields = proctl.stat_fields(pgid)
        if fields is None or fields[1] != self._proc.pid or fields[2] != pgid:
            return None
        return pgid

    def poll(self) -> Exit | None:
        code = self._proc.poll()
        if code is None:
            return None
        self._eof.wait(2.0)  # the report is the wrapper's last line
        if self._reported is not None:
            exit_code, sig, at = wrapper.parse_exit_report(self._reported)
            return exit_of(exit_code, sig, at)  # at: when it ended, this clock
        self.kill()  # the wrapper itself died: nothing may outlive it
        return exit_of(code)

    def terminate(self) -> None:
        # CONT: a stopped process must run to act on SIGTERM
        if self.pgid is not None:
            proctl.signal_group(self.pgid, (signal.SIGTERM, signal.SIGCONT))
        else:  # not started yet: the wrapper passes it on
            proctl.signal_pid(self._proc.pid, (signal.SIGTERM,))

    def kill(self) -> None:
        if self.pgid is not None:
            proctl.signal_group(self.pgid, (signal.SIGKILL,))
        proctl.kill_descendants(self._proc.pid)  # also those that left the worker's group

    def abandon(self) -> list:
        """A start that failed: SIGKILL the worker, everything below the wrapper, and the
        wrapper itself, wherever it is in its start (a wrapper not yet past starting its
        worker escapes ``kill``; a worker it starts after this dies with it, by
        PR_SET_PDEATHSIG). Returns the pids killed besides the wrapper, for ``wait_gone``.

        The wrapper is stopped (SIGSTOP) before its descendants are listed, so that it cannot
        start its worker between the listing and its own death: such a worker would die of
        PR_SET_PDEATHSIG, but unlisted, ``wait_gone`` would not wait for it."""
        proctl.signal_pid(self._proc.pid, (signal.SIGSTOP,))
        proctl.wait_until(lambda: proctl.state(self._proc.pid) in (None, "T", "t", "Z"), 1.0)
        below = proctl.descendants(self._proc.pid)
        self.kill()
        proctl.signal_pid(self._proc.pid, (signal.SIGKILL,))
        return below

    def wait_gone(self, pids: list, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the wrapper and ``pids`` to be gone; returns whether
        they are."""
        deadline = time.monotonic() + timeout_s
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return bool(proctl.wait_until(
            lambda: not any(proctl.state(p) not in (None, "Z") for p in pids),
            max(0.0, deadline - time.monotonic())))

    def stopped(self) -> bool:
        return self.pgid is not None and proctl.is_stopped(self.pgid)

    def dump_stacks(self) -> None:
        if self.pgid is not None:  # the worker leads its group: its pid is the pgid
            proctl.signal_pid(self.pgid, (interrupts.STACKS_SIGNAL,))

    def request_profile(self, text: str, failed=None) -> None:
        profiling.write_request(self.plan.run_dir or ".", text)  # the run directory is here


def start_all(plan: Plan, grace_s: float = 3.0) -> list:
    """Start every planned process here; if one cannot start (or an interrupt comes),
    kill those already started."""
    workers: list[LocalWorker] = []
    try:
        for process in plan.processes:
            workers.append(LocalWorker(process, grace_s))
    except BaseException:
        killed = [(w, w.abandon()) for w in workers]
        deadline = time.monotonic() + proctl.KILL_WAIT_S  # gone before the launcher raises
        for w, pids in killed:
            w.wait_gone(pids, max(0.0, deadline - time.monotonic()))
        raise
    return workers


def coordinator_port(job) -> int:
    """The spec's coordinator port, checked free on 127.0.0.1, or a free one for 0.

    Raises:
      SpecError: the spec's fixed port is in use.
      LaunchError: no TCP socket can be opened here (a sandbox, a locked-down host).
    """
    port = job.cluster.coordinator_port or 0
    try:
        if port == 0:
            return proctl.free_port(HOST)
        error = proctl.bind_error(port, HOST)
    except OSError as exc:
        raise LaunchError(no_socket("the JAX coordinator of a job of "
                                    f"{plural(job.num_processes, 'process')}", exc)) from None
    if error is not None:
        raise SpecError([Problem(job.source, None, "cluster.coordinator_port",
                                 f"{error} on {HOST}; pick another or use 0")])
    return port


def no_socket(what: str, exc: OSError) -> str:
    """The sentence for a TCP socket that cannot be opened at all (``exc``), for ``what``."""
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    return (f"{what} needs a TCP port on {HOST}, and this machine allows no TCP socket "
            f"({why}, errno {exc.errno}): a sandbox or locked-down host; a job of one process "
            "needs none (cluster.num_processes: 1)")


def coordinator_address(job) -> str:
    """``host:port`` of the coordinator, or ``127.0.0.1:0`` for a trainer job of one process,
    which joins no ``jax.distributed`` (``worker.joining.single_process``) and so opens no
    socket: nothing is picked, nothing listens, a machine without TCP runs it."""
    if not job.needs_coordinator and not job.cluster.coordinator_port:
        return f"{HOST}:0"
    return f"{HOST}:{coordinator_port(job)}"


def local_placement(job, run_dir: str, python: str, num_processes: int,
                    local_device_count: int, env: dict, platform: str = "cpu") -> Placement:
    """``num_processes`` on this machine with ``local_device_count`` devices of ``platform``."""
    return Placement(host="localhost", num_processes=num_processes,
                     local_device_count=local_device_count, platform=platform, python=python,
                     run_dir=run_dir, job_path=os.path.join(run_dir, "job.json"), env=env,
                     label_host=False, cwd=job.working_directory)


def placements(job, run_dir: str, python: str, platform: str) -> tuple:
    """Every process's placement on this machine: one for all of them on the CPU or on every
    chip, one per process where each gets its own TPU chips (libtpu's variables) or GPUs.

    Raises:
      LaunchError: a TPU split needs a port per process and no TCP socket can be opened.
    """
    cluster, n, devices = job.cluster, job.num_processes, job.local_device_count
    env = dict(cluster.env)
    if platform == "tpu":  # a JAX_PLATFORMS=cpu this shell exported must not hide the chips
        env = {"JAX_PLATFORMS": "tpu", **env}
    if platform == "cpu" or n == 1:
        return (local_placement(job, run_dir, python, n, devices, env, platform),)
    if platform == "tpu":
        try:
            ports = tuple(proctl.free_port(HOST) for _ in range(n))
        except OSError as exc:
            raise LaunchError(no_socket("libtpu, to split the chips among processes,", exc)) \
                from None
        chips = len(cluster.chips)
        return tuple(local_placement(job, run_dir, python, 1, devices,
                                     {**localdevices.tpu_env(chips, n, i, ports), **env}, platform)
                     for i in range(n))
    return tuple(local_placement(job, run_dir, python, 1, devices,
                                 {**localdevices.gpu_env(devices, i), **env}, platform)
                 for i in range(n))


def check_chips_free(job) -> None:
    """Refuse to start while another process holds this machine's TPU chips or GPUs.

    Raises:
      LaunchError: a holder lives (its pid, command and the files it holds are named;
        nothing is stopped or removed: libtpu's lock file goes with its holder).
    """
    cluster = job.cluster
    if not cluster.chips:
        return
    lockfile = cluster.libtpu_lockfile if cluster.resolved_platform == "tpu" else None
    found, _ = localdevices.holders(cluster.chips, lockfile)
    if found:
        raise LaunchError(f"the {cluster.resolved_platform.upper()} is in use: "
                          f"{localdevices.describe_holders(found)}; wait for it to end, or stop it "
                          f"(kill {' '.join(str(pid) for pid, _, _ in found)}), then launch again")


class LocalSession(Session):
    def prepare(self, restart: bool = False) -> tuple[tuple, str]:
        job = self.job
        platform = self.platform()
        if platform != "cpu":  # the dry run names a holder too: the run would be refused
            check_chips_free(job)
        return placements(job, self.run_dir, self.options.python, platform), \
            coordinator_address(job)

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
        found = (f"{plural(len(cluster.chips), name)} found on this machine "
                 f"({', '.join(cluster.chips)})")
        if platform == "cpu":
            return f"devices: {found}; rehearsed on CPU devices, {each} per process"
        if self.job.num_processes == 1:
            return f"devices: {found}; one process gets every one"
        return f"devices: {found}; {plural(self.job.local_device_count, name)} per process"

    def describe_start(self, plan: Plan) -> str:
        cluster, platform = self.job.cluster, self.platform()
        each = plural(plan.job.local_device_count, f"{platform.upper()} device"
                      if platform != "cpu" else "CPU device")
        mode = ("single-host debug mode" if platform == "cpu" else
                f"{plural(len(cluster.chips), 'TPU chip' if platform == 'tpu' else 'GPU')} "
                "found on this machine")
        if plan.job.num_processes == 1 and plan.coordinator_address.endswith(":0"):
            where = "no coordinator (one process)"
        else:
            where = f"coordinator {plan.coordinator_address}"
        return f"starting {plural(plan.num_processes, 'process')} x {each} ({mode}), {where}"

    def start(self, plan: Plan) -> list:
        return start_all(plan, self.job.cluster.grace_s)


class RehearsalSession(LocalSession):
    """``--rehearse`` of a tpu or gpu split: the same processes and devices, on CPU devices."""

    def platform(self) -> str:
        return "cpu"


class LocalBackend(Backend):
    name = "local"
    cluster_type = LocalCluster

    def check(self, job, options: Options) -> None:
        checks.check_task_importable(job)
        checks.check_worker_is_podlaunchs(job)
        checks.check_fits_in_memory(job)

    def session(self, job, run_dir: str, console=None, options: Options | None = None) -> Session:
        return LocalSession(job, run_dir, console, options)

    def rehearsal(self, job) -> Backend:
        """A tpu or gpu split's processes and devices, on CPU devices (``--rehearse``).

        Raises:
          SpecError: the job already runs on the CPU.
        """
        if job.cluster.resolved_platform == "cpu":
            return super().rehearsal(job)
        return LocalRehearsal()


class LocalRehearsal(LocalBackend):
    name = "local-rehearsal"

    def session(self, job, run_dir: str, console=None, options: Options | None = None) -> Session:
        return RehearsalSession(job, run_dir, console, options)
