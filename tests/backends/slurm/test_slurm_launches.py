"""Which queued jobs and steps of a job are another live launch's and which are stale
(``launcher.backends.slurm.launches``), against Slurm's answers as they change between two reads;
tests/backends/slurm/test_slurm.py runs launches side by side on the real Slurm."""

from __future__ import annotations

import os

from launcher.backends.slurm import launches
from launcher.rundir import runlock

NAME = "podlaunch.linear"


class Answers:
    """A Slurm whose jobs and steps are read from lists, one answer a call (the last repeats)."""

    def __init__(self, jobs: list, steps: list | None = None):
        self.jobs, self.steps = jobs, steps or [[]]

    def jobs_named(self, name):
        return [(j, "RUNNING") for j in ("7", "8")]

    def job(self, job_id):
        answers = self.jobs[int(job_id) - 7]
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def steps_named(self, job_id, prefix):
        return self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]


def record(run_dir, job_id: str, state: str = "RUNNING") -> dict:
    return {"JobId": job_id, "JobState": state,
            "StdOut": os.path.join(run_dir, "slurm", f"batch-{job_id}.out")}


def test_a_launch_that_ends_between_the_queue_and_its_lock_is_not_called_stale(tmp_path):
    """Issue 71's kind: squeue lists a job, its launcher ends (its job cancelled, then its lock
    dropped) before the lock is asked: the job is read again, gone, and is neither stale nor
    beside. A job still queued after its free lock is stale; a held one runs beside."""
    ended, dead, live = (str(tmp_path / n) for n in ("ended", "dead", "live"))
    for run_dir in (ended, dead):
        runlock.acquire(run_dir, "--run-dir").release()  # a lock file nobody holds
    held = runlock.acquire(live, "--run-dir")
    try:
        slurm = Answers([[record(ended, "7"), record(ended, "7", "CANCELLED")],
                         [record(dead, "8")]])
        assert launches.queued_jobs(slurm, NAME) == ([("8", "RUNNING", dead)], [])
        slurm = Answers([[record(ended, "7"), None], [record(live, "8")]])
        assert launches.queued_jobs(slurm, NAME) == ([], [("8", "RUNNING", live)])
        # steps: one of a launch that ended meanwhile (listed, then not), one of no known run
        first = [("5.1", f"{NAME}.aaaa.p0"), ("5.2", f"{NAME}.bbbb.p0"), ("5.3", f"{NAME}.mine.p0")]
        slurm = Answers([[None]], steps=[first, first[1:]])
        assert launches.job_steps(slurm, "5", NAME, f"{NAME}.mine.") == (
            [("5.3", f"{NAME}.mine.p0")], [("5.2", f"{NAME}.bbbb.p0")])
    finally:
        held.release()
