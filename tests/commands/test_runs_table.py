"""``launch runs`` fits the terminal (issue 70, item 3): in 80 columns no row wraps, newest
first, with a limit and a filter by state; a failed run says the step it reached of those
planned, and ``loss`` is never called final while the run goes on."""

from __future__ import annotations

import json
import os
import socket

import pytest

from launcher import proctl
from launcher.commands import runs
from launcher.errors import SpecError


def _run(root, job: str, stamp: str, state: str, **extra):
    run = root / "runs" / job / stamp
    run.mkdir(parents=True)
    (run / "spec.yaml").write_text(f"name: {job}\n")
    record = {"job": job, "state": state, "started": f"2026-12-0{stamp[7]}T{stamp[9:11]}:00:00",
              "attempts": 3, "step": 20000, "num_steps": 20000, "final_loss": 0.00886711,
              "duration_s": 3725.4, "goodput": 0.87, "devices": "16x4 tpu",
              "failures": {"preemption": 12, "infrastructure": 3}}
    if state == "running":  # a live launcher: this test's own process
        record["launcher"] = {"pid": os.getpid(), "host": socket.gethostname(),
                              "since": proctl.start_ticks(os.getpid())}
        record.update(eta_s=7300.0, progress_at=__import__("time").time())
    record.update(extra)
    (run / "run.json").write_text(json.dumps(record))
    return run


@pytest.fixture
def many(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "80")
    _run(tmp_path, "diabetes-regression", "20261201-090000-000", "succeeded")
    _run(tmp_path, "linear", "20261202-090000-000", "failed", step=4170)
    _run(tmp_path, "linear", "20261203-090000-000", "running", step=1510, final_loss=0.0123)
    _run(tmp_path, "linear", "20261204-090000-000", "interrupted", step=900)
    for day in range(5, 10):
        _run(tmp_path, "digits", f"2026120{day}-090000-000", "succeeded")
    return tmp_path


def _rows(capsys, *argv) -> list:
    assert runs.main(list(argv)) == 0
    return capsys.readouterr().out.splitlines()


def test_in_80_columns_no_row_wraps_and_each_run_is_named_as_commands_take_it(many, capsys):
    lines = _rows(capsys)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    assert lines[0].split()[:4] == ["run", "state", "steps", "loss"]
    names = [line.split()[0] for line in lines[1:]]
    assert names[:5] == [f"digits/2026120{d}-090000-000" for d in (9, 8, 7, 6, 5)]  # newest first
    assert names[5:8] == ["linear/20261204-090000-000", "linear/20261203-090000-000",
                          "linear/20261202-090000-000"]
    # a long job's name is cut before a column is given up; its stamp names it as well
    assert names[8].endswith("…/20261201-090000-000") and names[8].startswith("diabetes")
    assert lines[0].split()[:5] == ["run", "state", "steps", "loss", "time"]


def test_a_wider_terminal_shows_more_columns(many, capsys, monkeypatch):
    narrow = _rows(capsys)[0].split("  ")
    monkeypatch.setenv("COLUMNS", "200")
    wide = _rows(capsys)
    assert max(len(line) for line in wide) > 80
    assert "run dir" in wide[0] and "run dir" not in narrow and "failures" in wide[0]


def test_a_failed_run_says_the_step_it_reached_and_a_live_one_no_final_loss(many, capsys):
    lines = {line.split()[0]: line for line in _rows(capsys)[1:]}
    assert " 4170/20000 " in lines["linear/20261202-090000-000"]
    assert " 900/20000 " in lines["linear/20261204-090000-000"]
    live = lines["linear/20261203-090000-000"]
    assert "running, ETA 2h01m" in live and " 1510/20000 " in live and "0.0123" in live
    assert "final" not in _rows(capsys)[0]


def test_a_limit_and_a_filter_by_state(many, capsys):
    lines = _rows(capsys, "-n", "3")
    assert len(lines) == 1 + 3 + 1 and lines[-1] == "(3 of 9 runs shown, newest first; -n 0 shows all)"
    assert len(_rows(capsys, "-n", "0")) == 1 + 9
    failed = _rows(capsys, "--state", "failed,interrupted")
    assert [line.split()[0] for line in failed[1:]] == ["linear/20261204-090000-000",
                                                        "linear/20261202-090000-000"]
    assert [line.split()[0] for line in _rows(capsys, "linear", "--state", "running")[1:]] == [
        "linear/20261203-090000-000"]
    with pytest.raises(SpecError, match="'faild' is no run's state; did you mean 'failed'"):
        runs.main(["--state", "faild"])
