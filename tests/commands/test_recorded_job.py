"""The run's job is the one recorded at its start (``launcher.rundir.jobrecord``): a detached
run taken back after its ``job.yaml`` was edited restarts with the recorded job, and says what
changed; ``launch stop`` of a run whose spec and the user's key are both gone stops every
process that proves itself by the run's secret, and names what it could not prove. Real
launcher, real JAX workers, the local backend."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from harness.adopted import attach_to_end, kill, logged_step
from harness.detached import step, supervisor, supervisors, until  # noqa: F401 (a fixture)
from harness.helpers import LAUNCH, REPO, env_for_tests, run_pids
from harness.runs import fault

pytestmark = pytest.mark.slow  # real workers

LINEAR = open(os.path.join(REPO, "jobs", "linear.yaml")).read()


def _launch(*args, env) -> subprocess.CompletedProcess:
    return subprocess.run(LAUNCH + list(args), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_a_run_taken_back_after_its_job_file_was_edited_restarts_with_the_recorded_job(
        tmp_path, supervisors):
    """Its supervisor killed and ``job.yaml`` edited, ``launch attach``'s restart ran the
    edited job (here: no restart allowed any more, so the run failed)."""
    job, run_dir = tmp_path / "job.yaml", tmp_path / "run"
    job.write_text(LINEAR + "restarts:\n  program_errors: 1\n  backoff_s: 1\n")
    env = env_for_tests(XDG_STATE_HOME=str(tmp_path / "state"))
    started = _launch(str(job), "--set", "train.num_steps=200", "--set",
                      "logging.log_every_steps=20", *fault("exit", 40), "--set",
                      "task.args.sleep_s=0.05", "--set", "task.args.slow_process_id=0",
                      "--set", "task.args.slow_attempt=0", "--set", "checkpoint.every_steps=20",
                      "--run-dir", str(run_dir), "--detach", env=env)
    assert started.returncode == 0, started.stdout + started.stderr
    killed = supervisor(run_dir)
    supervisors.append(killed)
    until(lambda: logged_step(run_dir) >= 20, "step 20 in process 0's log")
    kill(killed)
    job.write_text(LINEAR + "restarts:\n  program_errors: 0\n  backoff_s: 1\n")
    said = attach_to_end(run_dir, 240, env=env)
    supervisors.append(supervisor(run_dir))
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded" and record["attempts"] == 2, (record, said[-3000:])
    assert (f"{job} changed since the run started (restarts.program_errors: 1 -> 0): the run "
            "goes on with the job recorded at its start") in (run_dir / "launcher.log").read_text() + said


def test_stop_without_the_spec_or_the_key_stops_every_process_that_proves_itself(
        tmp_path, supervisors):
    """With ``job.yaml`` deleted and the user's key gone (a new login), ``launch stop RUN``
    could not stop the run and left its 3 processes running."""
    job, run_dir, state = tmp_path / "job.yaml", tmp_path / "run", tmp_path / "state"
    job.write_text(LINEAR)
    env = env_for_tests(XDG_STATE_HOME=str(state))
    started = _launch(str(job), "--set", "train.num_steps=1000000", "--set",
                      "logging.log_every_steps=20", "--set", "task.name=faulty_task:make",
                      "--set", "task.args.sleep_s=0.02", "--run-dir", str(run_dir), "--detach",
                      env=env)
    assert started.returncode == 0, started.stdout + started.stderr
    killed = supervisor(run_dir)
    supervisors.append(killed)
    until(lambda: step(run_dir) >= 20, "a first logged step")
    kill(killed)
    workers = run_pids(str(run_dir))
    assert len(workers) == 2
    job.unlink()
    (state / "podlaunch" / "key").unlink()
    # a process of the user's that names the run without its secret: said, never signalled
    decoy = subprocess.Popen(["sleep", "120"], env={"PODLAUNCH_RUN_DIR": str(run_dir)})
    try:
        stopped = _launch("stop", str(run_dir), "--timeout-s", "60", env=env)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "stopping the 4 processes that prove themselves the run's by its secret" in \
            stopped.stdout, stopped.stdout
        assert f"not signalled, as they do not show the run's secret: pid {decoy.pid}" in \
            stopped.stdout, stopped.stdout
        assert decoy.poll() is None
        assert [p for p in run_pids(str(run_dir)) if p != decoy.pid] == []
    finally:
        decoy.kill()
        decoy.wait()
