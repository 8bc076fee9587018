"""A detached run over SSH hosts (ssh and tpu backends) whose supervisor is SIGKILLed mid-run
and taken back by ``launch attach``: the steps of tests/backends/ssh/test_ssh_adopt.py and
tests/backends/tpu/test_tpu_adopt.py, and what each asserts of the run's end."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import time

from harness.detached import supervisor, until
from harness.helpers import LAUNCH, REPO, checked_ledger, env_for_tests, pids_with_env
from harness.runs import assert_same_params, params

STEPS = 200
EVERY = 20
STEPS_ARGS = ("--set", f"train.num_steps={STEPS}", "--set", f"logging.log_every_steps={EVERY}")
# process 0 sleeps 50 ms a step (faulty_task's math is jobs/linear.yaml's): about 10 s
PACED_0 = ("--set", "task.name=faulty_task:make", "--set", "task.args.sleep_s=0.05",
           "--set", "task.args.slow_process_id=0")


def journal(run_dir) -> dict:
    try:
        return json.loads((run_dir / "supervisor.json").read_text())
    except (OSError, ValueError):
        return {}


def _json(path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def logged_step(run_dir, attempt_dir: str = "") -> int:
    """The last step process 0's log (of ``attempt_dir``, e.g. ``attempt-1``) has a line of."""
    try:
        text = (run_dir / "logs" / attempt_dir / "process-000.log").read_text()
    except OSError:
        return 0
    return max((int(s) for s in re.findall(rf" step (\d+)/{STEPS} loss", text)), default=0)


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    until(lambda: not os.path.exists(f"/proc/{pid}") or
          open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", "the supervisor gone")


def alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def attach(run_dir, env=None) -> subprocess.Popen:
    return subprocess.Popen(LAUNCH + ["attach", str(run_dir)], cwd=REPO, env=env or env_for_tests(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)


def attach_to_end(run_dir, timeout_s: float, env=None) -> str:
    """``launch attach`` on ``run_dir`` until the run ends; asserts it exited 0 and returns its
    output (the attach is killed if the wait runs out)."""
    attached = attach(run_dir, env)
    try:
        code = attached.wait(timeout=timeout_s)
    finally:
        attached.kill()
    out = attached.stdout.read()
    assert code == 0, out[-5000:]
    return out


def kill_and_take_back(run_dir, remote_dirs: list, supervisors: list, env=None) -> str:
    """The detached run in ``run_dir`` (its workers' run directories on their hosts:
    ``remote_dirs``) SIGKILLed mid-run and taken back by ``launch attach``; asserts that the
    very processes the killed supervisor started go on, and returns attach's output once the
    run ended (exit 0)."""
    killed = supervisor(run_dir)
    supervisors.append(killed)
    until(lambda: logged_step(run_dir) >= 2 * EVERY, "step 40 in process 0's log", 180)
    wrappers = sorted(w["pid"] for w in journal(run_dir)["workers"])
    workers = sorted(p for d in remote_dirs for p in pids_with_env("PODLAUNCH_RUN_DIR", d))
    assert len(wrappers) == len(remote_dirs) and len(workers) == len(remote_dirs), (wrappers, workers)
    kill(killed)
    # nobody watches: the workers train on, writing into their files on their hosts
    killed_at = time.time()
    outs = [os.path.join(d, "output", "attempt-0", f"process-{i:03d}.out")
            for i, d in enumerate(remote_dirs)]  # one process per host
    sizes = [os.path.getsize(p) for p in outs]
    until(lambda: all(os.path.getsize(p) > s for p, s in zip(outs, sizes)), "output unwatched")
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o600 for p in outs)
    assert all(map(alive, wrappers + workers)), "a process died with its supervisor"
    # each follower saw its channel end and said so in its wrapper's pid file: the run's
    # launcher is gone (the next launch's preflight reads it), until a supervisor takes it back
    pid_files = [os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(d))), ".podlaunch",
                              "linear", f"{os.path.basename(d)}.process-{i:03d}.pid")
                 for i, d in enumerate(remote_dirs)]
    until(lambda: all("launcher_gone_at" in _json(p) or not os.path.exists(p) for p in pid_files),
          "launcher_gone_at")  # (a pid file is removed as its wrapper ends)
    attached = attach(run_dir, env)
    try:
        until(lambda: supervisor(run_dir) != killed, "a new supervisor in run.json")
        supervisors.append(supervisor(run_dir))
        # taken back, not restarted: the new journal names the very wrappers the killed one
        # started, and their workers go on
        until(lambda: journal(run_dir).get("alive_at", 0) > killed_at and journal(run_dir)["workers"],
              "the new supervisor's journal")
        assert sorted(w["pid"] for w in journal(run_dir)["workers"]) == wrappers
        # (under load the run may near its end meanwhile: none new, whichever have ended)
        assert set(p for d in remote_dirs for p in pids_with_env("PODLAUNCH_RUN_DIR", d)) <= set(workers)
        until(lambda: not any("launcher_gone_at" in _json(p) for p in pid_files),
              "launcher_gone_at cleared")
        code = attached.wait(timeout=240)
    finally:
        attached.kill()
    out = attached.stdout.read()
    assert code == 0, out[-5000:]
    return out


def assert_as_uninterrupted(run_dir, want: dict, num_processes: int) -> None:
    assert_same_params(params(run_dir), want)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded" and record["attempts"] == 1, record
    assert not (run_dir / "logs" / "attempt-1").exists()
    assert not (run_dir / "supervisor.json").exists()
    # every step line once in each process's log: none lost while nobody read, none twice
    for i in range(num_processes):
        log = (run_dir / "logs" / f"process-{i:03d}.log").read_text()
        seen = [int(s) for s in re.findall(rf" step (\d+)/{STEPS} loss", log)]
        assert seen == list(range(EVERY, STEPS + 1, EVERY)), (i, seen)
    ledger = checked_ledger(run_dir)
    assert len(ledger["attempts"]) == 1
    # the gap is a fact beside the buckets: its steps were trained, and count
    assert ledger["attempts"][0]["unwatched_s"] > 0, ledger
    assert ledger["attempts"][0]["buckets_s"]["unsupervised"] == 0, ledger
    assert re.search(rf"taking the run back after \d+\.\d s without a supervisor: attempt 0's "
                     rf"{num_processes} processes", (run_dir / "launcher.log").read_text())
