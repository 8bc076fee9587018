"""A Slurm job's lifecycle, process-free: scripted ``scontrol`` records in fake time
(``launcher.backends.slurm.lifecycle``); tests/backends/slurm/test_slurm.py follows real jobs."""

from __future__ import annotations

import re

import pytest

from harness.fakes import FakeClock
from launcher.backends.slurm import lifecycle
from launcher.backends.slurm.lifecycle import JobLifecycle, Phase
from launcher.errors import LaunchError
from launcher.ends import Exited, Final, Killed, Lost, Preempted


def job(state: str, **fields) -> dict:
    return {"JobId": "7", "JobState": state, "PreemptTime": "None", **fields}


class Scripted:
    """``Slurm.job`` for one job: a list of (fake time, record or None), the latest due wins."""

    def __init__(self, clock: FakeClock, script: list):
        self.clock, self.script, self.reads = clock, script, 0

    def __call__(self, job_id: str):
        self.reads += 1
        due = [record for at, record in self.script if at <= self.clock.now]
        return due[-1] if due else None


def follow(script: list, limit_s: float = 600) -> tuple[JobLifecycle, FakeClock]:
    clock = FakeClock(limit_s=limit_s)
    return JobLifecycle(Scripted(clock, script), poll_s=0.5, clock=clock, sleep=clock.sleep), clock


@pytest.mark.parametrize("record, want", [
    (None, Phase.GONE), (job("RUNNING"), Phase.RUNNING), (job("PENDING"), Phase.WAITING),
    (job("REQUEUED"), Phase.WAITING), (job("COMPLETING"), Phase.SETTLING),
    (job("RUNNING", PreemptTime="2026-12-01T10:00:00"), Phase.SETTLING),
    (job("PREEMPTED"), Phase.RESUBMIT), (job("NODE_FAIL"), Phase.RESUBMIT),
    (job("TIMEOUT"), Phase.TIMEOUT), (job("CANCELLED", Reason="TimeLimit"), Phase.TIMEOUT),
    (job("CANCELLED"), Phase.ENDED), (job("COMPLETED"), Phase.ENDED),
])
def test_each_record_is_one_phase(record, want):
    assert lifecycle.phase(record) is want


def test_a_pending_job_is_followed_until_it_runs_saying_each_new_reason():
    said: list = []
    life, clock = follow([(0, job("PENDING", Reason="Priority")), (3, job("PENDING", Reason="Resources")),
                          (5, job("RUNNING", NodeList="n[1-2]"))])
    record = life.wait_running("7", said.append)
    assert record["NodeList"] == "n[1-2]" and clock.now == 5.0
    assert said[0] == "pending (Priority)" and said[-1] == "pending (Resources)"


def test_a_job_that_ends_before_it_runs_is_an_error_naming_its_state():
    life, _ = follow([(0, job("PENDING", Reason="Priority")), (1, job("CANCELLED", Reason="None"))])
    with pytest.raises(LaunchError, match=r"Slurm job 7 ended before it ran: CANCELLED \(None\)"):
        life.wait_running("7")


def test_a_preemption_settles_before_its_outcome_is_read():
    # RUNNING with a preemption announced, then requeued: the next attempt waits for it
    life, clock = follow([(0, job("RUNNING", PreemptTime="t")), (20, job("COMPLETING")),
                          (25, job("PENDING", Reason="BeginTime"))])
    record = life.settled("7", limit_s=120)
    assert record["JobState"] == "PENDING" and clock.now == 25.0
    stuck, clock = follow([(0, job("COMPLETING"))])
    assert stuck.settled("7", limit_s=120)["JobState"] == "COMPLETING" and clock.now >= 120


@pytest.mark.parametrize("script, ended, kind, words", [
    ([(0, job("RUNNING"))], Exited(1), Exited, "exit code 1"),
    ([(0, job("TIMEOUT"))], Killed(15), Final, "Slurm job 7 reached its time limit (TIMEOUT; task "
                                               "killed by SIGTERM): raise cluster.time_limit"),
    ([(0, job("RUNNING", PreemptTime="t"))], Killed(9), Preempted, "Slurm job 7 is being preempted"),
    ([(0, job("PREEMPTED"))], Killed(15), Preempted, "Slurm job 7 is PREEMPTED"),
    ([(0, job("PENDING", PreemptTime="t"))], Exited(143), Preempted, "Slurm job 7 is PENDING"),
    ([(0, job("COMPLETING")), (10, job("NODE_FAIL"))], Exited(0), Lost, "Slurm job 7 is NODE_FAIL"),
    ([], Exited(1), Lost, "Slurm job 7 is GONE"),
    # cancelled by someone else: a restart cannot help (final, not an infrastructure fault)
    ([(0, job("CANCELLED"))], Killed(15), Final, "Slurm job 7 ended (CANCELLED; task killed by "
                                                  "SIGTERM): it is not resubmitted"),
])
def test_a_failed_step_is_read_against_its_job(script, ended, kind, words):
    life, _ = follow(script)
    got = life.judge("7", ended, "/runs/r")
    assert type(got) is kind and words in str(got), got


def test_a_cancelled_job_is_waited_out_of_the_queue():
    life, clock = follow([(0, job("RUNNING")), (2, job("COMPLETING")), (4, None)])
    assert life.gone("7", timeout_s=15) and 4 <= clock.now < 5
    running, _ = follow([(0, job("RUNNING"))])
    assert not running.gone("7", timeout_s=3)


def test_a_sigterm_within_the_time_limit_lead_is_the_limit_s_notice_and_final():
    """``--signal=TERM@120`` (cluster.time_limit_lead_s): a task ended by SIGTERM while its
    running job has about that long left is final, like TIMEOUT; earlier it is the task's
    own end (a preemption's class, by the launcher's classifier)."""
    import datetime

    soon = (datetime.datetime.now() + datetime.timedelta(seconds=100)).isoformat(timespec="seconds")
    later = (datetime.datetime.now() + datetime.timedelta(hours=2)).isoformat(timespec="seconds")
    for ended in (Exited(143), Killed(15)):
        life, _ = follow([(0, job("RUNNING", EndTime=soon))])
        got = life.judge("7", ended, "/runs/r", lead_s=120)
        assert type(got) is Final, got
        assert re.search(r"Slurm job 7 is \d+ s from its time limit, and its notice "
                         r"\(--signal=TERM@120\) stopped the task .*: raise cluster\.time_limit "
                         r"and continue with --resume /runs/r", str(got)), got
    for script, ended, lead in (([(0, job("RUNNING", EndTime=later))], Exited(143), 120),
                                ([(0, job("RUNNING", EndTime=soon))], Exited(1), 120),
                                ([(0, job("RUNNING", EndTime=soon))], Exited(143), 0),
                                ([(0, job("RUNNING", EndTime="Unknown"))], Exited(143), 120)):
        life, _ = follow(script)
        assert life.judge("7", ended, "/runs/r", lead_s=lead) == ended


CANCELLED = "slurmstepd: error: *** STEP 26.1 ON n2 CANCELLED AT 2026-12-01T10:00:00 DUE TO TIME LIMIT ***"
TIMED_OUT = "srun: error: Timed out waiting for job step to complete"


@pytest.mark.parametrize("said", [
    [CANCELLED, TIMED_OUT], [TIMED_OUT, CANCELLED],
    [TIMED_OUT, "srun: error: n2: task 0: Terminated", CANCELLED],
    ["srun: error: n2: task 0: Exited with exit code 143", CANCELLED],
])
@pytest.mark.parametrize("code", [0, 143])
def test_a_step_slurm_cancelled_at_its_time_limit_is_final_in_any_order_of_lines(said, code):
    """Issue 71: in one of two CI runs a job at its time limit was filed as a program error
    (its task's exit 0 read before the job's state said TIMEOUT): the class depended on which
    line came first. slurmstepd's line decides it, whatever the order and the job's state as
    read (still RUNNING while its tasks are killed)."""
    from launcher.backends.slurm.workers import SrunWorker

    life, _ = follow([(0, job("RUNNING"))])
    worker = SrunWorker.__new__(SrunWorker)  # srun's lines and exit code alone, no srun
    worker._ended, worker.failed_node = None, None
    worker.judge = lambda ended, node, time_limit=False: life.judge("7", ended, "/runs/r",
                                                                    time_limit=time_limit)
    for line in said:
        worker._said_by_srun(line)
    got = worker._verdict(code)
    assert type(got) is Final, got
    assert str(got).startswith("Slurm job 7 reached its time limit (TIMEOUT; task "), got
    assert "raise cluster.time_limit and continue with --resume /runs/r" in str(got)
    # without slurmstepd's line, an exit 0 is the task's own (a success, or an early end)
    plain = SrunWorker.__new__(SrunWorker)
    plain._ended, plain.failed_node, plain.judge = None, None, worker.judge
    plain._said_by_srun(TIMED_OUT)
    assert plain._verdict(0) == Exited(0)
