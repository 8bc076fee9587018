"""A resume that would change what is trained is refused before anything starts: the batch
size (128 -> 150 keeps 150 batches per epoch over 19,200 rows, where the checkpoint cannot see
it), the data and the task; other settings are said and go on. Real spec.yaml files, the
real CLI."""

from __future__ import annotations

import os

import pytest
import yaml

from harness.helpers import REPO, launch
from launcher import backends
from launcher import spec as specs
from launcher.errors import SpecError
from launcher.rundir import specdiff as resumes

JOB = f"{REPO}/jobs/linear.yaml"


def _run_dir_of(tmp_path, *overrides) -> str:
    """A run directory whose spec.yaml is what a launch of JOB with ``overrides`` keeps."""
    job = specs.load(JOB, None, overrides, registry=backends)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(job.to_masked_dict(), sort_keys=False))
    return str(tmp_path)


@pytest.mark.parametrize("key, before, now", [
    ("train.global_batch_size", "128", "148"),  # 300 rows: 2 batches per epoch either way
    ("data.num_examples", "300", "301"),
    ("data.shuffle", "false", "true"),
    ("task.name", "linear_regression", "faulty_task:make"),
])
def test_a_resume_that_changes_what_is_trained_is_refused_before_anything_starts(tmp_path, key,
                                                                                 before, now):
    base = ("data.num_examples=300", "train.global_batch_size=128")
    run_dir = _run_dir_of(tmp_path, *base, f"{key}={before}")
    done = launch(JOB, "--resume", run_dir, *[a for b in base for a in ("--set", b)],
                  "--set", f"{key}={now}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert f"--resume: {key}: " in done.stderr and "changes what is trained" in done.stderr, done.stderr
    assert f"--set {key}={before}" in done.stderr and "nothing was started" in done.stderr
    assert not (tmp_path / "logs").exists() and not (tmp_path / "run.json").exists()


def test_settings_that_do_not_change_the_batches_are_not_refused(tmp_path):
    run_dir = _run_dir_of(tmp_path)
    now = specs.load(JOB, None, ("train.num_steps=99", "optimizer.learning_rate=0.5",
                                 "data.prefetch=4", "logging.log_every_steps=3"), registry=backends)
    resumes.check(run_dir, now.to_masked_dict())  # no SpecError
    changed = [key for key, _, _ in resumes.changes(run_dir, now.to_masked_dict())]
    assert changed == ["data.prefetch", "logging.log_every_steps", "optimizer.learning_rate",
                       "train.num_steps"]


@pytest.mark.parametrize("where", ["checkpoints", "local-checkpoints/process-001"])
def test_a_resume_below_the_newest_checkpoint_is_refused_naming_the_run_s_steps(tmp_path, where):
    """A newcomer's report: `launch stop`, then `launch jobs/linear.yaml --resume RUN` as the
    stop said, resumed a 200,000-step run from its checkpoint of step 16,399 with the job
    file's 100 steps, trained nothing and ended "succeeded" at 16399/100."""
    run_dir = _run_dir_of(tmp_path, "train.num_steps=200000")
    (tmp_path / where / "step-0016399").mkdir(parents=True)
    done = launch(JOB, "--resume", run_dir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "logs").exists()
    assert ("--resume: train.num_steps: 100, below step 16399, the run's newest checkpoint: "
            "the resume would restore it and train nothing; resume with the run's value "
            "(--set train.num_steps=200000) or any value above 16399") in done.stderr, done.stderr
    above = launch(JOB, "--resume", run_dir, "--set", "train.num_steps=20000", "--dry-run")
    assert above.returncode == 0, above.stdout + above.stderr


def test_the_resume_check_reads_a_local_tier_outside_the_run_and_offers_only_values_that_work(
        tmp_path):
    """A tester's second pass: copies under a ``checkpoint.local_dir`` outside the run
    (``/dev/shm/NAME``: the run's own directory there) were not seen, so the launch started
    and its worker refused; and a run whose spec an earlier resume had lowered was offered that
    same value, which the check refuses."""
    from worker.contract import runfiles

    (tmp_path / "run").mkdir()
    run_dir = _run_dir_of(tmp_path / "run", "train.num_steps=120")
    outside = tmp_path / "shm"
    base = runfiles.local_tier_base(str(outside), run_dir)
    os.makedirs(os.path.join(base, "process-000", "step-0000252"))
    done = launch(JOB, "--resume", run_dir, "--set", f"checkpoint.local_dir={outside}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert ("train.num_steps: 100, below step 252, the run's newest checkpoint: the resume would "
            "restore it and train nothing; resume with any value above 252") in done.stderr, done.stderr
    assert "the run's value" not in done.stderr  # its 120 would be refused too


def test_the_newest_checkpoint_is_the_newest_of_every_place_that_holds_some(tmp_path):
    """Process 0's checkpoints (step 200, the newest) and two processes' local copies (steps
    100 and 150, older) are all counted: the newest is 200 whichever place is read last."""
    (tmp_path / "checkpoints" / "step-0000200").mkdir(parents=True)
    for process, step in ((0, 100), (1, 150)):
        (tmp_path / "local-checkpoints" / f"process-{process:03d}" / f"step-{step:07d}").mkdir(
            parents=True)
    (tmp_path / "local-checkpoints" / "process-002").mkdir()  # a process that saved none
    assert resumes.newest_checkpoint(str(tmp_path)) == 200
    job = specs.load(JOB, None, ("train.num_steps=180",), registry=backends)
    with pytest.raises(SpecError, match="180, below step 200, the run's newest checkpoint"):
        resumes.check_steps_left(str(tmp_path), job, {})
