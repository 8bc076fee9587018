"""Single-host debug mode: every process is a subprocess of the launcher.

Each worker leads its own session (so its process group can be signalled as a
whole, and a Ctrl-C in the terminal reaches only the launcher, which then
tears down in order) and gets PR_SET_PDEATHSIG, so even a SIGKILLed launcher
leaves no worker behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
from typing import Iterator

from launcher.errors import LaunchError, Problem, SpecError
from launcher.plan import Plan, ProcessPlan, make_plan
from launcher.spec import JobSpec
from launcher.supervise import Exit

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listener could bind ``host:port`` now (TIME_WAIT leftovers do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: teardown still covers every normal path
        pass


class LocalWorker:
    """A worker process on this machine, leader of its own process group."""

    def __init__(self, plan: ProcessPlan):
        self.plan = plan
        env = {**os.environ, **plan.env}
        try:
            self._proc = subprocess.Popen(
                list(plan.argv), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
                text=True, encoding="utf-8", errors="replace", bufsize=1)
        except OSError as exc:
            raise LaunchError(f"cannot start process_id {plan.process_id}: {plan.argv[0]}: "
                              f"{exc.strerror}") from None

    @property
    def pid(self) -> int:
        return self._proc.pid

    def lines(self) -> Iterator[str]:
        for line in self._proc.stdout:
            yield line.rstrip("\n")
        self._proc.stdout.close()

    def poll(self) -> Exit | None:
        code = self._proc.poll()
        if code is None:
            return None
        self._signal(signal.SIGKILL)  # anything the worker left in its group goes too
        return Exit(signal=-code) if code < 0 else Exit(code=code)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self._proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)
        self._signal(signal.SIGCONT)  # a stopped process must run to act on SIGTERM

    def stopped(self) -> bool:
        """Whether the worker is stopped (state T: SIGSTOP, or a tracer), from /proc."""
        try:
            with open(f"/proc/{self._proc.pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state in (b"T", b"t")

    def kill(self) -> None:
        self._signal(signal.SIGKILL)


def prepare(job: JobSpec, run_dir: str, python: str, console=None) -> Plan:
    """Choose the coordinator port (checked free) and plan every process.

    Raises:
      SpecError: the spec's fixed coordinator_port is in use.
    """
    port = job.cluster.coordinator_port
    if port == 0:
        port = free_port()
    elif not port_is_free(port):
        raise SpecError([Problem(job.source, None, "cluster.coordinator_port",
                                 f"port {port} is in use on 127.0.0.1; pick another or use 0")])
    return make_plan(job, run_dir, port, python)


def describe_start(plan: Plan) -> str:
    return (f"starting {plan.num_processes} processes x {plan.job.local_device_count} CPU devices "
            f"(single-host debug mode), coordinator {plan.coordinator_address}")


def start(plan: Plan, console=None) -> list[LocalWorker]:
    """Start every planned process; if one cannot start, stop those already started."""
    workers: list[LocalWorker] = []
    try:
        for process in plan.processes:
            workers.append(LocalWorker(process))
    except LaunchError:
        for w in workers:
            w.kill()
        raise
    return workers
