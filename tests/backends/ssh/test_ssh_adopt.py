"""A detached ssh run whose supervisor is SIGKILLed loses nothing: its workers train on, their
output kept in a file on each host, and ``launch attach`` takes the very same processes back
(the wrappers proven on their hosts), reads what they printed meanwhile from the journaled
offset, and the run ends as it would have without the interruption. Real sshd hosts
(tests/harness/sshenv.py), real JAX workers; every wait polls a condition against a deadline."""

from __future__ import annotations

import json
import re

import pytest

from harness import detached
from harness.adopted import (EVERY, PACED_0, STEPS_ARGS, assert_as_uninterrupted, attach, kill,
                             kill_and_take_back, logged_step)
from harness.helpers import pids_with_env
from harness.runs import assert_same_params, fault, params, remote_run_dir, ssh_cluster

pytestmark = pytest.mark.slow
supervisors = detached.supervisors  # a fixture: every supervisor and worker gone at the end


def test_a_killed_ssh_supervisor_is_taken_back_by_attach_and_the_run_ends_as_uninterrupted(
        tmp_path, two_ssh_hosts, supervisors, reference_params):
    run_dir = tmp_path / "run"
    started = detached.launch("jobs/linear.yaml", "--cluster", ssh_cluster(tmp_path, two_ssh_hosts),
                              "--set", "cluster.devices_per_process=2", *STEPS_ARGS, *PACED_0,
                              "--run-dir", str(run_dir), "--detach", timeout_s=300)
    assert started.returncode == 0, started.stdout + started.stderr
    remote = [str(remote_run_dir(tmp_path / f"host{i}", run_dir)) for i in range(2)]
    out = kill_and_take_back(run_dir, remote, supervisors)
    assert "OK: 2 processes succeeded" in out, out[-3000:]
    # 2 hosts x 1 process x 2 devices: a local 2 x 2 run's params
    assert_as_uninterrupted(run_dir, reference_params(*STEPS_ARGS), 2)


def test_a_process_that_failed_unwatched_on_its_host_is_classified_from_its_exit_report(
        tmp_path, two_ssh_hosts, supervisors, reference_params):
    # process 1 exits with code 7 after step 60 of attempt 0 while no supervisor watches: its
    # wrapper's exit report is in its file on its host, where the attach's follower reads it
    run_dir = tmp_path / "run"
    started = detached.launch("jobs/linear.yaml", "--cluster", ssh_cluster(tmp_path, two_ssh_hosts),
                              *STEPS_ARGS, *PACED_0, "--set", "task.args.slow_attempt=0",
                              *fault("exit", 60), "--set", "checkpoint.every_steps=20",
                              "--set", "restarts.program_errors=1", "--set", "restarts.backoff_s=1",
                              "--run-dir", str(run_dir), "--detach", timeout_s=300)
    assert started.returncode == 0, started.stdout + started.stderr
    killed = detached.supervisor(run_dir)
    supervisors.append(killed)
    detached.until(lambda: logged_step(run_dir) >= EVERY, "step 20 in process 0's log", 180)
    kill(killed)
    host1 = str(remote_run_dir(tmp_path / "host1", run_dir))
    detached.until(lambda: not pids_with_env("PODLAUNCH_RUN_DIR", host1), "process 1's end, unwatched")
    attached = attach(run_dir)
    try:
        code = attached.wait(timeout=240)
    finally:
        attached.kill()
    out = attached.stdout.read()
    assert code == 0, out[-5000:]
    log = (run_dir / "launcher.log").read_text()
    assert re.search(r"attempt 0 failed: process_id 1 .*code 7 \[program error\]; restarting", log), \
        log[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded" and record["attempts"] == 2, record
    assert record["failures"] == {"program error": 1}, record
    assert_same_params(params(run_dir), reference_params(*STEPS_ARGS))
