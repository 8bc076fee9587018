"""``train.steps_per_call: auto`` (worker.trainer.calls): how many steps a device call runs;
and that each log step of a call is logged from its own row of the call's metrics
(``worker.telemetry.metrics.StepLogger``)."""

import math
import re

import numpy as np
import pytest

from worker.trainer import calls


def test_auto_is_one_step_a_call_on_cpu_devices_and_a_number_is_used_as_given():
    assert calls.steps_per_call("auto", "cpu", (0, 30000, 0), 1024) == 1
    assert calls.steps_per_call(7, "tpu", (0, 70, 0), 10**9) == 7


@pytest.mark.parametrize("num_steps, done, every, want", [
    (30000, 0, 0, 1000),      # the linear job on a chip: the cap
    (100, 0, 1000, 100),      # jobs/linear.yaml: the whole run, one call
    (30000, 5000, 0, 1000),   # resumed at a boundary of the same choice
    (30000, 1234, 0, 2),      # resumed elsewhere: calls still end on the checkpoint step
    (997, 0, 0, 997),         # a prime number of steps under the cap
    (1009, 0, 0, 1),          # a prime above it: one step a call
    (3000, 0, 250, 250),
])
def test_auto_on_a_chip_is_the_largest_common_divisor_under_the_cap(num_steps, done, every, want):
    k = calls.steps_per_call("auto", "tpu", (done, num_steps, every), 4096)
    assert k == want
    assert num_steps % k == 0 and done % k == 0 and (every == 0 or every % k == 0)


def test_auto_keeps_a_large_step_call_short():
    # 65,536 x 256 float32 rows a step (64 MiB): estimated at 0.84 ms, so at most 119 steps
    step = calls.step_bytes({"x": np.zeros((65536, 256), np.float32),
                             "y": np.zeros((65536, 1), np.float32)},
                            (np.zeros((256, 1), np.float32), np.zeros((1,), np.float32)))
    assert step == 65536 * 257 * 4 + 3 * 257 * 4
    k = calls.steps_per_call("auto", "tpu", (0, 3000, 0), step)
    assert k == 100  # the largest divisor of 3000 under the cap
    estimate_s = calls.STEP_OVERHEAD_S + step / calls.ASSUMED_BYTES_PER_S
    assert k * estimate_s <= calls.CALL_TARGET_S < (k + 20) * estimate_s * 1.2
    # a step estimated above the target: one step a call
    assert calls.steps_per_call("auto", "gpu", (0, 3000, 0), 10**10) == 1


def test_log_steps_are_rows_of_the_call():
    assert calls.metrics_every(10, 4) == 2
    assert calls.metrics_every(1000, 100) == 100
    assert calls.metrics_every(100, 1000) == 100
    for k, log_every in [(10, 4), (12, 8), (1000, 7)]:
        every = calls.metrics_every(k, log_every)
        assert k % every == 0 and math.lcm(every, log_every) == log_every


def test_each_log_step_of_a_fused_call_is_written_with_its_own_row_of_the_call_s_metrics(
        tmp_path):
    """A call of 10 steps with a log step every 4 returns a row every 2 steps
    (``metrics_every``): log steps 4 and 8 are rows 1 and 3 of the first call, 24, 28 and
    30 rows 1, 3 and 4 of the third. Each is written with its own row (here each row's loss
    is its step), not the call's last nor a neighbour's."""
    import json

    from harness.helpers import REPO
    from launcher import backends
    from launcher import spec as specs
    from worker.contract.metrics import STEP_METRICS
    from worker.telemetry.metrics import StepLogger
    from worker.telemetry.tracker import METRICS_FILE, JsonlTracker

    job = specs.load(f"{REPO}/jobs/linear.yaml", None, (
        "train.num_steps=30", "logging.log_every_steps=4", "logging.tensorboard=false"),
        registry=backends).job_file()
    k, every = 10, calls.metrics_every(10, 4)
    tracker = JsonlTracker(str(tmp_path / METRICS_FILE))
    logger = StepLogger(job, 0, 1, tracker, out=lambda text: None, lag=0, read_every_s=0.0,
                        steps_per_call=k, metrics_every=every)
    assert len(STEP_METRICS) == 3  # loss, grad_norm, param_norm
    # the call ending at step ``last``: [local_device_count, rows, STEP_METRICS], a row's loss
    # its step
    train_call = logger.timed(lambda last: np.array(
        [[[step, 1.0, 2.0] for step in range(last - k + every, last + 1, every)]], np.float32))
    for last in range(k, 31, k):
        logger.after_dispatch(last, train_call(last))
    logger.finish()
    tracker.close()
    written = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [(w["step"], w["loss"]) for w in written] == [(s, float(s)) for s in
                                                        (4, 8, 12, 16, 20, 24, 28, 30)]


class _Rows:
    """A call's rows as the logger sees them: ``is_ready`` as a device array's, read as numpy."""

    def __init__(self, step: int):
        self.step, self.ready = step, False

    def is_ready(self) -> bool:
        return self.ready

    def block_until_ready(self):
        self.ready = True
        return self

    def __array__(self, dtype=None, copy=None):
        return np.array([[self.step, 1.0, 2.0]], np.float32)


def test_a_log_step_is_timed_once_its_rows_are_ready_and_those_found_together_share_the_time():
    """On one CPU device (and a chip) the queue waits only every 0.1 s, so its ``finished_step``
    alone would time a short run's log steps all at its end, microseconds apart (a 100-step
    run showed 3.7 million steps/s). A log step whose rows are on hand is finished; log steps
    found finished together share the interval since the last one timed."""
    from harness.helpers import REPO
    from launcher import backends
    from launcher import spec as specs
    from worker.telemetry.metrics import StepLogger
    from worker.telemetry.tracker import NullTracker

    job = specs.load(f"{REPO}/jobs/linear.yaml", None, (
        "train.num_steps=40", "logging.log_every_steps=10", "logging.tensorboard=false"),
        registry=backends).job_file()
    now, lines = [0.0], []
    logger = StepLogger(job, 0, 1, NullTracker(), out=lines.append, clock=lambda: now[0],
                        read_every_s=0.0, finished_step=lambda: 0)  # the queue never waited
    rows = {step: _Rows(step) for step in range(1, 41)}
    call = logger.timed(lambda step: rows[step])
    for step in range(1, 41):
        now[0] = step * 1e-3  # each call 1 ms after the last
        logger.after_dispatch(step, call(step))
        if step == 15:
            rows[10].ready = True  # step 10's rows came back: timed at step 16's dispatch
        if step == 35:
            rows[20].ready = rows[30].ready = True  # both found at step 36's
    logger.finish()  # step 40 waited for, then timed
    times = {int(m[1]): float(m[2]) for m in re.finditer(
        r"step (\d+)/40 .* step_time_s (\S+) ", "\n".join(lines))}
    # the time from the first call's end to step 16's dispatch, over step 10's steps
    assert times[10] == pytest.approx(0.015 / 10)
    assert times[20] == times[30] == pytest.approx(0.020 / 20)  # 20 steps in 20 ms, alike
    assert times[40] == pytest.approx(0.004 / 10)


def test_a_flush_times_what_was_just_found_finished_with_what_it_waits_for():
    """At a checkpoint step the logger finds the previous log step finished (late: the calls
    after it have run too) and the save's flush then waits for the checkpoint step's own:
    timed apart, the second got a few microseconds for its ten steps (0.3-1 million steps/s
    shown, the line before at half its rate). Now they share the interval."""
    from harness.helpers import REPO
    from launcher import backends
    from launcher import spec as specs
    from worker.telemetry.metrics import StepLogger
    from worker.telemetry.tracker import NullTracker

    job = specs.load(f"{REPO}/jobs/linear.yaml", None, (
        "train.num_steps=40", "logging.log_every_steps=10", "logging.tensorboard=false"),
        registry=backends).job_file()
    now, lines = [0.0], []
    logger = StepLogger(job, 0, 1, NullTracker(), out=lines.append, clock=lambda: now[0],
                        read_every_s=1e9, finished_step=lambda: 0)
    rows = {step: _Rows(step) for step in range(1, 41)}
    call = logger.timed(lambda step: rows[step])
    for step in range(1, 21):
        now[0] = step * 1e-3
        if step == 20:
            rows[10].ready = True  # found at step 20's dispatch, finished long before
        logger.after_dispatch(step, call(step))
    now[0] = 0.02001  # the checkpoint's flush: step 20's call ends 10 us later
    logger.flush()
    times = [float(m[1]) for m in re.finditer(r"step_time_s (\S+) ", "\n".join(lines))]
    assert len(times) == 2 and times[0] == times[1] == pytest.approx(0.01901 / 20)


def test_the_settings_declare_their_periods_and_a_new_period_ends_calls_with_no_other_change():
    """Steps per call follows from the periods the settings declare
    (``worker.contract.periods``): the linear job's calls end at its last step and its saves,
    its rows fall at its log steps, its local copies at the next call end. An evaluation every
    250 steps, declared as one setting of a section of its own, makes ``auto`` end calls on
    it, and nothing else is told."""
    import dataclasses

    from launcher import backends, spec as specs
    from worker.contract import periods, sections

    job = specs.load("jobs/linear.yaml", registry=backends).job_file()
    assert periods.of(job, periods.ENDS_A_CALL) == [
        (("train", "num_steps"), job.train.num_steps),
        (("checkpoint", "every_steps"), job.checkpoint.every_steps)]
    assert periods.of(job, periods.A_ROW) == [(("logging", "log_every_steps"),
                                                job.logging.log_every_steps)]
    assert periods.of(job, periods.NEXT_CALL_END) == [
        (("checkpoint", "local_every_steps"), job.checkpoint.local_every_steps)]
    off = dataclasses.replace(job, checkpoint=dataclasses.replace(job.checkpoint, every_steps=0))
    assert periods.steps(off, periods.ENDS_A_CALL) == [job.train.num_steps]  # 0: never
    with pytest.raises(ValueError, match="expected one of"):
        periods.of(job, "sometimes")

    @dataclasses.dataclass(frozen=True)
    class Evaluation:
        every_steps: int = sections.setting(250, period=periods.ENDS_A_CALL)

    @dataclasses.dataclass(frozen=True)
    class WithEvaluation:
        train: sections.Train
        checkpoint: sections.Checkpoint
        evaluation: Evaluation

    train = dataclasses.replace(job.train, num_steps=3000)
    before = WithEvaluation(train, dataclasses.replace(job.checkpoint, every_steps=1000),
                            Evaluation(every_steps=0))
    after = dataclasses.replace(before, evaluation=Evaluation())
    assert calls.steps_per_call("auto", "tpu", [0, *periods.steps(before, periods.ENDS_A_CALL)],
                                4096) == 1000
    assert calls.steps_per_call("auto", "tpu", [0, *periods.steps(after, periods.ENDS_A_CALL)],
                                4096) == 250


def test_the_next_logging_call_is_the_first_call_that_logs_as_logs_in_says():
    """A run of quiet calls dispatches the rows call at ``next_logging_call`` alone
    (``worker.trainer.loop``): it must be the first call end, of ``step``, ``step + k``, ...,
    whose call ``logs_in`` says logs (log steps at call ends or inside calls, the last step
    off the period; k divides the last step, as the launcher asks), else a log line is lost or
    a call returns rows for nobody."""
    from harness.helpers import REPO
    from launcher import backends
    from launcher import spec as specs
    from worker.telemetry.metrics import StepLogger
    from worker.telemetry.tracker import NullTracker

    for k, log_every, num_steps in ((1, 10, 95), (2, 25, 3000), (4, 10, 96), (5, 3, 40), (8, 100, 64)):
        job = specs.load(f"{REPO}/jobs/linear.yaml", None, (
            f"train.num_steps={num_steps}", f"logging.log_every_steps={log_every}",
            "logging.tensorboard=false"), registry=backends).job_file()
        logger = StepLogger(job, 0, 1, NullTracker(), out=lambda text: None, steps_per_call=k,
                            metrics_every=math.gcd(k, log_every))
        for step in range(k, num_steps + 1, k):
            ends = [e for e in range(step, num_steps + 1, k) if logger.logs_in(e - k + 1, e)]
            assert logger.next_logging_call(step) == (ends[0] if ends else math.inf), (k, log_every, step)
