"""A run that ran every step to a nan loss diverged: it is not listed, summed up or exited
as a success (issue 51.2). Process-free: a real Result, Record and summary."""

from __future__ import annotations

import json
import types

from launcher.commands import runs as runs_command
from launcher.rundir import record as runs
from launcher.console.status import summary
from launcher.state import Result, State
from launcher.stats import ProcessStats
from worker.contract import wire


def _ended(*losses: float) -> Result:
    processes = []
    for process_id, loss in enumerate(losses):
        line = wire.PROGRESS_FORMAT.format(step=50, num_steps=50, loss=loss, steps_per_s=10.0,
                                               step_time_s=0.1, own_step_time_s=0.01)
        stats = ProcessStats()
        stats.observe(line, 1.0)
        plan = types.SimpleNamespace(process_id=process_id, host="localhost",
                                     label=f"p{process_id}", log_path="/x")
        processes.append(types.SimpleNamespace(stats=stats, state=State.SUCCEEDED, plan=plan,
                                               exit=None, last_step=50))
    return Result(processes, None, False, 2.0)


def test_a_run_that_ends_with_a_nan_loss_is_listed_diverged_not_succeeded(tmp_path):
    run_dir = tmp_path / "runs" / "linear" / "20261206-020000-000"
    run_dir.mkdir(parents=True)
    record = runs.Record(str(run_dir), "linear", 50)
    record.start()
    record.end("succeeded", _ended(float("nan"), float("nan")),
               [types.SimpleNamespace(number=0, failure=None)])
    written = json.loads((run_dir / "run.json").read_text())
    # the loss kept by name (JSON has no nan): `launch runs` showed "-" for it (issue 63)
    assert written["state"] == "diverged" and written["final_loss"] == "nan", written
    past = runs.read(str(run_dir))
    assert past.state == "diverged" and past.final_loss != past.final_loss  # nan
    row = runs_command.table([past]).splitlines()[1]
    assert " diverged " in row and " nan " in row, row


def test_a_finite_final_loss_is_a_success_and_nan_is_said_in_the_summary():
    assert _ended(0.25, 0.25).diverged_loss is None
    assert _ended(float("inf")).diverged_loss == float("inf")
    report = summary(_ended(float("nan"), float("nan")))
    assert "OK:" not in report and "DIVERGED: every step ran, but the final loss is nan" in report
    assert "OK: 1 process succeeded" in summary(_ended(0.25))
