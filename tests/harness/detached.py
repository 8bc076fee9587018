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


def launch(*args, timeout_s=120, cwd=REPO) -> subprocess.CompletedProcess:
    """``launch ARGS`` to its end, stdin from /dev/null, output captured (text)."""
    return subprocess.run(LAUNCH + list(args), cwd=cwd, env=env_for_tests(), capture_output=True,
                          text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)


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
def supervisors():
    """A list of the supervisors a test detached (its own ``append``), SIGKILLed at its end
    whatever happened (the local wrappers die with them; an ssh run's hosts are then the
    ssh harness's restore's): a failing test leaves no run training in the background."""
    started: list = []
    yield started
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
