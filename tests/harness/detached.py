"""Runs started with ``launch --detach`` in tests: their supervisor, and a clean-up that
leaves none of them training in the background when a test fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from harness.helpers import LAUNCH, REPO, env_for_tests


def launch(*args, timeout_s=120, cwd=REPO, **env) -> subprocess.CompletedProcess:
    """``launch ARGS`` to its end, stdin from /dev/null, output captured (text); ``env``:
    variables beside ``env_for_tests``'s."""
    return subprocess.run(LAUNCH + list(args), cwd=cwd, env=env_for_tests(**env),
                          capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)


def until(done, what: str, timeout_s: float = 120.0):
    """Poll ``done()`` until it answers (its answer), failing the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = done()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.1)


def step(run_dir) -> int:
    """The step run.json says the running run reached (0 before any)."""
    try:
        return json.loads((run_dir / "run.json").read_text()).get("step") or 0
    except (OSError, ValueError):
        return 0


def supervisor(run_dir) -> int:
    return json.loads((run_dir / "run.json").read_text())["launcher"]["pid"]


@pytest.fixture
def supervisors(tmp_path):
    """A list of the supervisors a test detached (its own ``append``), SIGKILLed at its end
    whatever happened, with every worker of a run under the test's ``tmp_path`` (a detached
    run's wrappers outlive their supervisor; an ssh run's hosts are then the ssh harness's
    restore's): a failing test leaves no run training in the background."""
    started: list = []
    yield started
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # a supervisor that took a run back (launch attach), then every worker left
    for pid in launchers_naming(str(tmp_path)) + workers_under(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def launchers_naming(root: str) -> list:
    """Live launchers (``-m launcher.cli``) whose command line names a path under ``root``."""
    return _pids_whose("cmdline", lambda argv: b"launcher.cli" in argv
                       and any(root.encode() in a for a in argv))


def workers_under(root: str) -> list:
    """Live workers whose run directory (``PODLAUNCH_RUN_DIR``) is under ``root``."""
    prefix = os.path.abspath(root).encode()
    return workers_where(lambda run_dir: run_dir.startswith(prefix))


def workers_where(match) -> list:
    """Pids of the processes whose ``PODLAUNCH_RUN_DIR`` (bytes) ``match`` accepts."""
    return _pids_whose("environ", lambda items: any(
        item.startswith(b"PODLAUNCH_RUN_DIR=") and match(item.partition(b"=")[2]) for item in items))


def _pids_whose(name: str, match) -> list:
    """Pids whose ``/proc/PID/<name>`` (split at its NULs) ``match`` accepts."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                items = f.read().split(b"\0")
        except OSError:
            continue
        if match(items):
            found.append(int(pid))
    return found
