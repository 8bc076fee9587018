"""``launch JOB.yaml --detach`` and the commands that reach a run by name: real launcher,
real JAX workers, the local backend. Every wait polls against a generous deadline."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from harness.detached import launch, step, supervisor, supervisors, until  # noqa: F401 (a fixture)
from harness.helpers import LAUNCH, PACED, REPO, env_for_tests, run_pids

pytestmark = pytest.mark.slow  # real workers

LONG = ("jobs/linear.yaml", "--set", "train.num_steps=1000000", "--set", "logging.log_every_steps=20",
        "--set", "cluster.devices_per_process=1", *PACED)
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")  # UTC, milliseconds


def test_a_detached_run_is_reached_by_logs_runs_wait_attach_and_stopped_in_order(tmp_path, supervisors):
    run_dir = tmp_path / "runs" / "linear" / "r1"
    started = launch(*LONG, "--run-dir", str(run_dir), "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    assert f"run directory {run_dir}" in started.stdout
    for command in ("logs", "attach", "wait", "stop"):
        assert f"launch {command} {run_dir}" in started.stdout
    pid = supervisor(run_dir)
    supervisors.append(pid)
    # the command ended; the run goes on (each wrapper starts its worker: under load that
    # can come a moment after the wrappers were started, so the test waits for it)
    until(lambda: len(run_pids(str(run_dir))) == 2, "both workers")
    assert os.getsid(pid) == pid  # its own session: no terminal reaches it
    until(lambda: step(run_dir) >= 40, "run.json's step")
    # launch runs: a running run's step, loss and ETA (its attempt under way counted); its short
    # name reaches it
    table = launch("runs", "--root", str(tmp_path / "runs"), cwd=str(tmp_path), COLUMNS="200")
    row = table.stdout.splitlines()[1]
    assert re.search(r"^linear/r1 +running, ETA \S+ +\d+/1000000 +0\.00\d+ ", row), table.stdout
    assert re.search(r" 1 +- +2x1 cpu +runs/linear/r1$", row), table.stdout  # its devices (LONG: 1 each)
    # ... and its goodput so far: the ledger's productive / wall seconds, which the live
    # supervisor writes into run.json with the step (ledger.json is written at the end)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "running" and 0 < record["goodput"] < 1, record
    assert not (run_dir / "ledger.json").exists()
    shown = re.search(r" running, ETA \S+ +\d+/1000000 +\S+ +\S+ +(\d\.\d\d) ", row)
    assert shown and abs(float(shown.group(1)) - record["goodput"]) <= 0.2, (row, record)
    # every line of launcher.log has its time (launch logs -t shows it, launch logs the lines
    # as the console showed them); process 0's lines and the progress are there
    logs = launch("logs", "linear/r1", "--root", str(tmp_path / "runs"), "--timestamps")
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert lines and all(STAMP.match(line) for line in lines), lines[:5]
    assert any("[p0] step " in line for line in lines)
    plain = launch("logs", "linear/r1", "--root", str(tmp_path / "runs")).stdout.splitlines()
    assert plain and not any(STAMP.match(line) for line in plain), plain[:5]
    assert plain[0].startswith("podlaunch: ") and any(line.startswith("[p0] step ") for line in plain)
    until(lambda: "running | step" in (run_dir / "launcher.log").read_text(), "a progress line")
    one = launch("logs", str(run_dir), "--process", "1")
    assert one.returncode == 0 and "step " in one.stdout, one.stderr
    assert (run_dir / "console.log").stat().st_size > 0
    # wait honours its timeout while the run goes on
    waited = launch("wait", str(run_dir), "--timeout", "0.5", timeout_s=60)
    assert waited.returncode == 124 and "still running" in waited.stdout, waited
    # attach: the live view again, ended by the run's end with its exit code
    attached = subprocess.Popen(LAUNCH + ["attach", str(run_dir)], cwd=REPO, env=env_for_tests(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    follow = subprocess.Popen(LAUNCH + ["logs", str(run_dir), "-f"], cwd=REPO, env=env_for_tests(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        reached = step(run_dir)
        until(lambda: step(run_dir) >= reached + 20, "more steps")  # still training
        stopped = launch("stop", str(run_dir), timeout_s=300)
        # it returned: nothing of the run is left, at once
        assert run_pids(str(run_dir)) == [], stopped.stdout
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().split()[2] == "Z"
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "every process is gone (state interrupted)" in stopped.stdout
        # the command that continues it with the run's own job and settings, on a line of its
        # own (a newcomer followed a bare `launch JOB.yaml --resume RUN`, and the job file's
        # 100 steps)
        assert re.search(r"; continue this stopped run from its checkpoint of step \d+ .*:\n"
                         rf"  launch resume {re.escape(str(run_dir))}$", stopped.stdout, re.M), \
            stopped.stdout
        assert attached.wait(timeout=60) == 130 and follow.wait(timeout=60) == 130
    finally:
        for proc in (attached, follow):
            proc.kill()
    assert "[p0] step " in attached.stdout.read()
    # the agreed step was saved (the ordered stop), and the ended run answers at once
    assert re.search(r"checkpoint of step \d+ saved", (run_dir / "logs" / "process-000.log").read_text())
    assert launch("wait", str(run_dir), timeout_s=60).returncode == 130
    again = launch("stop", str(run_dir), timeout_s=60)
    assert again.returncode == 2 and "has ended (state interrupted)" in again.stderr, again.stderr
    assert launch("attach", str(run_dir), timeout_s=60).returncode == 2
    for command in ("stop", "logs", "wait"):
        unknown = launch(command, str(tmp_path / "nosuch"), timeout_s=60)
        assert unknown.returncode == 2 and "no run" in unknown.stderr, (command, unknown.stderr)


def test_a_detached_run_that_ends_and_a_detached_start_that_fails(tmp_path, supervisors):
    run_dir = tmp_path / "r"
    started = launch("jobs/linear.yaml", "--set", "train.num_steps=40", "--run-dir", str(run_dir),
                      "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    supervisors.append(supervisor(run_dir))
    followed = launch("logs", str(run_dir), "-f", timeout_s=300)
    assert followed.returncode == 0, followed.stdout[-3000:]
    assert "OK: 2 processes succeeded" in followed.stdout
    assert launch("wait", str(run_dir)).returncode == 0
    assert all(STAMP.match(line) for line in (run_dir / "launcher.log").read_text().splitlines())
    # a start that fails: the start's own exit code, its error on the terminal
    bad = launch("jobs/linear.yaml", "--set", "train.num_steps=-1", "--detach",
                  "--run-dir", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "train.num_steps" in bad.stderr, bad.stderr
    assert "detached" not in bad.stdout
