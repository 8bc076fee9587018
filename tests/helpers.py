"""Shared test helpers: run the real `launch` CLI, inspect the process table, read events."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = [sys.executable, "-m", "launcher.cli"]
TESTS = os.path.join(REPO, "tests")


def env_for_tests(**extra) -> dict:
    """This environment plus tests/ on PYTHONPATH (for test tasks), minus JAX device vars."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PODLAUNCH_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, REPO, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def launch(*args: str, timeout_s: float = 300, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run ``launch ARGS`` to completion; returns the CompletedProcess (text)."""
    return subprocess.run(LAUNCH + list(args), cwd=cwd or REPO, env=env_for_tests(),
                          capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)


def start_launch(*args: str, cwd: str | None = None) -> subprocess.Popen:
    """Start ``launch ARGS`` in the background, output piped (merged)."""
    return subprocess.Popen(LAUNCH + list(args), cwd=cwd or REPO, env=env_for_tests(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)


def pids_with_env(name: str, value: str) -> list[int]:
    """Live (non-zombie) pids whose environment has ``name=value``: the process table, read."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ and state != b"Z":
            found.append(int(entry))
    return found


def run_pids(run_dir: str) -> list[int]:
    """Live pids of the workers of the run in ``run_dir``."""
    return pids_with_env("PODLAUNCH_RUN_DIR", os.path.abspath(run_dir))


def wait_gone(run_dir: str, timeout_s: float) -> list[int]:
    """Wait until no worker of ``run_dir`` lives; returns the survivors (empty if none)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = run_pids(run_dir)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def read_scalars(logdir: str) -> dict:
    """Every scalar in every event file under ``logdir``, read with TensorBoard's own reader.

    Returns {tag: [(step, value), ...]} sorted by step.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict = {}
    for path in sorted(glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True)):
        acc = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {tag: sorted(values) for tag, values in out.items()}


def event_files(run_dir: str) -> list[str]:
    return glob.glob(os.path.join(run_dir, "**", "events.out.tfevents.*"), recursive=True)
