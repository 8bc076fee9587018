"""A detached ssh run whose supervisor is SIGKILLed loses nothing: its workers train on, their
output kept in a file on each host, and ``launch attach`` takes the very same processes back
(the wrappers proven on their hosts), reads what they printed meanwhile from the journaled
offset (or goes on with the restart's wait the killed one was in), and the run ends as it
would have without the interruption. Real sshd hosts (tests/harness/sshenv.py), real JAX
workers; every wait polls a condition against a deadline."""

from __future__ import annotations

import json
import re

import pytest

from launcher import logtimes
from harness import detached
from harness.adopted import (EVERY, PACED_0, STEPS_ARGS, assert_as_uninterrupted, attach,
                             attach_to_end, journal, kill, kill_and_take_back, logged_step)
from harness.helpers import checked_ledger, pids_with_env
from harness.runs import assert_same_params, fault, params, remote_run_dir, ssh_cluster

pytestmark = pytest.mark.slow
supervisors = detached.supervisors  # a fixture: every supervisor and worker gone at the end
WAIT_S = 8  # the restart's wait a supervisor is killed in (the next attach starts within it)


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


def test_a_process_that_failed_unwatched_on_its_host_is_classified_and_a_supervisor_killed_in_the_restarts_wait_is_taken_back(
        tmp_path, two_ssh_hosts, supervisors, reference_params):
    # process 1 exits with code 7 after step 60 of attempt 0 while no supervisor watches: its
    # wrapper's exit report is in its file on its host, where the attach's follower reads it;
    # that attach's supervisor is killed in the restart's wait, and a second attach takes the
    # run back in the wait and starts attempt 1 at the wait's end
    run_dir = tmp_path / "run"
    started = detached.launch("jobs/linear.yaml", "--cluster", ssh_cluster(tmp_path, two_ssh_hosts),
                              *STEPS_ARGS, *PACED_0, "--set", "task.args.slow_attempt=0",
                              *fault("exit", 60), "--set", "checkpoint.every_steps=20",
                              "--set", "restarts.program_errors=1",
                              "--set", f"restarts.backoff_s={WAIT_S}",
                              "--run-dir", str(run_dir), "--detach", timeout_s=300)
    assert started.returncode == 0, started.stdout + started.stderr
    killed = detached.supervisor(run_dir)
    supervisors.append(killed)
    detached.until(lambda: logged_step(run_dir) >= EVERY, "step 20 in process 0's log", 180)
    kill(killed)
    hosts = [str(remote_run_dir(tmp_path / f"host{i}", run_dir)) for i in range(2)]
    detached.until(lambda: not pids_with_env("PODLAUNCH_RUN_DIR", hosts[1]), "process 1's end, unwatched")
    first = attach(run_dir)
    try:
        detached.until(lambda: detached.supervisor(run_dir) != killed, "the first attach's supervisor")
        adopter = detached.supervisor(run_dir)
        supervisors.append(adopter)
        # it read the exit report, stopped process 0 (fail-fast), and waits before the restart
        detached.until(lambda: journal(run_dir).get("waiting"), "the restart's wait", 120)
        waiting = journal(run_dir)["waiting"]
        kill(adopter)
        first.wait(timeout=60)
    finally:
        first.kill()
    # the failed attempt was torn down on both hosts before the wait
    assert not any(pids_with_env("PODLAUNCH_RUN_DIR", d) for d in hosts)
    log = (run_dir / "launcher.log").read_text()
    assert re.search(r"attempt 0 failed: process_id 1 .*code 7 \[program error\]; restarting", log), \
        log[-3000:]
    attach_to_end(run_dir, 240)
    log = (run_dir / "launcher.log").read_text()
    # taken back in the wait (not after it), and attempt 1 started at the wait's end, not at once
    left = re.findall(r"attempt 0 had failed, and its restart waits (\d+\.\d) s more", log)
    assert len(left) == 1 and float(left[0]) > 0, log[-3000:]
    begun = [logtimes.time_of(line) for line in log.splitlines()
             if re.search(r" podlaunch: attempt 1 \(program error restart 1 of 1\): ", line)]
    assert len(begun) == 1, log[-3000:]
    assert begun[0].timestamp() >= waiting["until"] - 0.05, (begun[0], waiting)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded" and record["attempts"] == 2, record
    assert record["failures"] == {"program error": 1}, record
    assert not (run_dir / "logs" / "attempt-2").exists()
    assert_same_params(params(run_dir), reference_params(*STEPS_ARGS))
    ledger = checked_ledger(run_dir)
    assert [a["attempt"] for a in ledger["attempts"]] == [0, 1]
    failed = ledger["attempts"][0]["buckets_s"]
    # the wait: part watched, part not (nothing ran in it: the unwatched part is badput)
    assert failed["unsupervised"] > 0 and failed["restart_wait"] < WAIT_S, failed
    assert failed["restart_wait"] + failed["unsupervised"] >= WAIT_S - 0.01, failed
    # attempt 0's own gap before it (its processes ran, one failed) a fact beside the buckets
    assert ledger["attempts"][0]["unwatched_s"] > failed["unsupervised"], ledger["attempts"][0]
