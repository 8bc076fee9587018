"""worker.runtime.interrupts: the launcher's SIGTERM as SystemExit, held back while records are handed on.

Real signals to this process (``os.kill``): a Python handler runs at the next bytecode
after the kill returns, exactly where a SIGTERM from the launcher would land.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from launcher import backends
from launcher import spec as specs
from harness.helpers import REPO
from worker import contract, program
from worker.contract import wire
from worker.contract import job as jobs
from worker.recovery import checkpoint
from worker.runtime import channel, interrupts
from worker.contract.metrics import STEP_METRICS
from worker.telemetry.metrics import StepLogger
from worker.telemetry.tracker import METRICS_FILE, JsonlTracker


@pytest.fixture
def sigterm_handler():
    previous = signal.getsignal(signal.SIGTERM)
    interrupts.install()
    yield
    signal.signal(signal.SIGTERM, previous)


def _term_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def _job(name: str):
    return specs.load(os.path.join(REPO, "jobs", name), registry=backends).job_file()


def _identity(run_dir) -> contract.Identity:
    return contract.Identity(coordinator_address="127.0.0.1:1", num_processes=1, process_id=0,
                             local_device_count=1, platform="cpu",
                             job_path=str(run_dir / "job.json"), run_dir=str(run_dir))


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
    job = _job("linear.yaml")
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
            with interrupts.held():  # worker.trainer.loop.Loop.close, the teardown
                logger.close()
                tracker.close()
    assert raised.value.code == 143
    shown = [int(line.split()[1].split("/")[0]) for line in printed if line.startswith("step ")]
    assert shown == [10, 20, 30]
    written = [json.loads(line)["step"] for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert written == shown


def test_a_sigterm_during_a_program_log_step_loses_no_record(sigterm_handler, tmp_path, monkeypatch):
    """The same for a program's ``report``: its progress line printed is its record written."""
    job = _job("seed_program.yaml")
    assert isinstance(job, jobs.ProgramJob) and job.logging.log_every_steps == 10
    reporter = program._Reporter(_identity(tmp_path), job, num_steps=100)
    printed = []

    def fake_say(text=""):  # program.py's lines for the launcher; the TERM arrives during step 20's
        printed.append(text)
        if str(text).startswith("step 20/"):
            _term_self()

    monkeypatch.setattr(channel, "say", fake_say)
    with pytest.raises(SystemExit) as raised:
        try:
            for step in range(1, 31):
                reporter.report(step, {"loss": 1.0 / step})
        finally:
            reporter.close(wait_s=0.5)
    assert raised.value.code == 143
    assert [t.split()[1] for t in printed if t.startswith("step ")] == ["10/100", "20/100"]
    path = tmp_path / "tensorboard" / METRICS_FILE
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [10, 20]


def test_a_sigterm_during_a_checkpoint_save_ends_the_worker_after_it(sigterm_handler, tmp_path):
    """A TERM that lands mid-save (here: while the state is copied off the devices) ends
    the worker once the checkpoint is complete and its line printed, not halfway."""
    from worker.recovery.recovery import Recovery

    params = {"w": np.ones((1, 4, 1), np.float32), "b": np.zeros((1, 1), np.float32)}

    def unreplicate(state):
        _term_self()
        return [np.asarray(leaf[0]) for leaf in (state[0]["b"], state[0]["w"])]

    lines = []
    recovery = Recovery(_identity(tmp_path), _job("linear.yaml"), num_batches=1,
                        out=lines.append, unreplicate=unreplicate)
    with pytest.raises(SystemExit) as raised:
        recovery.after_step(100, params, (), done=np.float32(0.5))  # linear.yaml's last step
    assert raised.value.code == 143
    [line] = lines
    saved = wire.parse(line)
    assert isinstance(saved, wire.CheckpointSaved) and saved.step == 100
    assert line.endswith(": " + checkpoint.step_dir(checkpoint.directory(str(tmp_path)), 100))
    template = [np.zeros((1,), np.float32), np.zeros((4, 1), np.float32)]
    saved = checkpoint.latest(checkpoint.directory(str(tmp_path)), template, num_batches=1)
    assert saved.step == 100
