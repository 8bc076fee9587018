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

import dataclasses
import json
import os
import secrets
import signal
import subprocess
import threading
import time
from typing import Iterator, Literal

from launcher import proctl, remote
from launcher.spec import checks, schema
from launcher.backends.base import Backend, ClusterSettings, Options, Session
from launcher.errors import LaunchError, Problem, SpecError
from launcher.plan import Placement, Plan, ProcessPlan
from launcher.spec.schema import non_negative, port_or_zero, setting
from launcher.remote import wrapper
from launcher.state import Exit, exit_of
from launcher.console.words import plural
from worker import interrupts, profiling

HOST = "127.0.0.1"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalCluster(ClusterSettings):
    """Single-host debug mode: every process on this machine, CPU devices."""

    backend: Literal["local"] = setting("local", doc="local, ssh or tpu")
    num_processes: int = setting(2, check=schema.in_range(1, 256), doc="worker processes to start")
    devices_per_process: int = setting(2, check=schema.in_range(1, 256),
                                       doc="CPU devices each process sees (JAX_NUM_CPU_DEVICES)")
    coordinator_port: int = setting(0, check=port_or_zero,
                                    doc="JAX coordinator port on 127.0.0.1; 0 picks a free one")
    grace_s: float = setting(3.0, check=non_negative,
                             doc="after SIGTERM, wait this long before SIGKILL")
    env: dict[str, schema.EnvValue] = setting({}, check=schema.env_names,
                                              doc="extra environment for every worker")

    @property
    def platform(self) -> str:
        return "cpu"

    @property
    def num_processes_total(self) -> int:
        return self.num_processes


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
        argv = remote.python_call(plan.python or plan.argv[0], "wrapper", {
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
        PR_SET_PDEATHSIG). Returns the pids killed besides the wrapper, for ``wait_gone``."""
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
    """
    port = job.cluster.coordinator_port or 0
    if port == 0:
        return proctl.free_port(HOST)
    error = proctl.bind_error(port, HOST)
    if error is not None:
        raise SpecError([Problem(job.source, None, "cluster.coordinator_port",
                                 f"{error} on {HOST}; pick another or use 0")])
    return port


def local_placement(job, run_dir: str, python: str, num_processes: int,
                    local_device_count: int, env: dict) -> Placement:
    """All ``num_processes`` on this machine, with CPU devices."""
    return Placement(host="localhost", num_processes=num_processes,
                     local_device_count=local_device_count, platform="cpu", python=python,
                     run_dir=run_dir, job_path=os.path.join(run_dir, "job.json"), env=env,
                     label_host=False, cwd=job.program.dir if job.is_program else None)


class LocalSession(Session):
    def prepare(self, restart: bool = False) -> tuple[tuple, str]:
        job = self.job
        placement = local_placement(job, self.run_dir, self.options.python, job.num_processes,
                                    job.local_device_count, dict(job.cluster.env))
        return (placement,), f"{HOST}:{coordinator_port(job)}"

    def describe_start(self, plan: Plan) -> str:
        devices = plural(plan.job.local_device_count, "CPU device")
        return (f"starting {plural(plan.num_processes, 'process')} x {devices} "
                f"(single-host debug mode), coordinator {plan.coordinator_address}")

    def start(self, plan: Plan) -> list:
        return start_all(plan, self.job.cluster.grace_s)


class LocalBackend(Backend):
    name = "local"
    cluster_type = LocalCluster

    def check(self, job, options: Options) -> None:
        checks.check_task_importable(job)
        checks.check_fits_in_memory(job)

    def session(self, job, run_dir: str, console=None, options: Options | None = None) -> Session:
        return LocalSession(job, run_dir, console, options)
