"""worker.interrupts: the launcher's SIGTERM as SystemExit, held back while records are handed on.

Real signals to this process (``os.kill``): a Python handler runs at the next bytecode
after the kill returns, exactly where a SIGTERM from the launcher would land.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from launcher import spec as specs
from helpers import REPO
from worker import interrupts
from worker.job import WorkerJob
from worker.metrics import STEP_METRICS, StepLogger
from worker.tracker import METRICS_FILE, JsonlTracker


@pytest.fixture
def sigterm_handler():
    previous = signal.getsignal(signal.SIGTERM)
    interrupts.install()
    yield
    signal.signal(signal.SIGTERM, previous)


def _term_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_is_system_exit_143(sigterm_handler):
    with pytest.raises(SystemExit) as raised:
        _term_self()
        for _ in range(1000):  # the handler runs at the next bytecode at the latest
            pass
    assert raised.value.code == 143


def test_a_sigterm_inside_held_is_raised_when_the_outermost_block_ends(sigterm_handler):
    ran = []
    with pytest.raises(SystemExit) as raised:
        with interrupts.held():
            with interrupts.held():
                _term_self()
                ran.append("after the signal")
            ran.append("after the inner block")
        ran.append("never")
    assert raised.value.code == 143
    assert ran == ["after the signal", "after the inner block"]
    with interrupts.held():  # nothing pending any more
        pass


def test_a_sigterm_while_log_steps_are_printed_loses_no_record(sigterm_handler, tmp_path):
    """The CI failure this module exists for: a SIGTERM landing while a batch of log steps
    was printed ended the read between the progress lines and the records, so steps shown
    on the console never reached metrics.jsonl or TensorBoard."""
    job = WorkerJob.from_spec_dict(specs.load(os.path.join(REPO, "jobs", "linear.yaml")).to_dict())
    tracker = JsonlTracker(str(tmp_path / METRICS_FILE))
    printed = []

    def out(text: str) -> None:  # the worker's print; the launcher's TERM arrives during it
        printed.extend(text.splitlines())
        if len(printed) >= 3:
            _term_self()

    logger = StepLogger(job, 0, 1, tracker, out, lag=0, read_every_s=1e9)
    # the step's [local_device_count, len(STEP_METRICS)] metrics: loss, grad_norm, param_norm
    train_step = logger.timed(lambda step: np.array([[1.0 / step, 1.0, 2.0]], np.float32))
    assert len(STEP_METRICS) == 3
    with pytest.raises(SystemExit) as raised:
        try:
            for step in range(1, 32):
                if step == 31:  # the batch of log steps 10, 20, 30 is read now
                    logger.read_every_s = 0.0
                logger.after_dispatch(step, train_step(step))
        finally:
            with interrupts.held():  # worker.main.train's teardown
                logger.close()
                tracker.close()
    assert raised.value.code == 143
    shown = [int(line.split()[1].split("/")[0]) for line in printed if line.startswith("step ")]
    assert shown == [10, 20, 30]
    written = [json.loads(line)["step"] for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert written == shown
