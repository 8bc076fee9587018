"""A console for long runs (issue 70, item 2): on a terminal, step lines at a pace a person
reads, said once, while every logged step stays in launcher.log; the progress line fits the
terminal's width whatever it holds."""

from __future__ import annotations

import io
import re
import types

from launcher.console import Console, pace
from launcher.console.status import status_text
from launcher.plan import ProcessPlan
from launcher.state import State, Tracked
from worker.contract import wire


def _line(step: int, num_steps: int = 20000) -> str:
    return wire.Progress(step, num_steps, 0.00886711, 30.0, 0.033, 0.0001).text()


def test_a_long_run_in_a_100_by_40_terminal_shows_at_most_a_screen_of_step_lines_a_minute(
        tmp_path, monkeypatch):
    """The issue's example: `--set train.num_steps=20000` with log_every_steps 10 printed about
    2,000 step lines at up to 30 a second. Two minutes of such lines, at 30 a second."""
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("LINES", "40")
    now = [0.0]
    out = io.StringIO()
    console = Console(stream=out, show=frozenset({0}), tty=True, clock=lambda: now[0])
    console.log_to(str(tmp_path / "launcher.log"))
    steps = list(range(10, 3601, 10))  # 360 log steps over 120 s
    for i, step in enumerate(steps):
        now[0] = i / 3.0
        console.line("p0", _line(step), 0)
    console.line("p0", _line(20000), 0)  # the last step: always shown
    shown = re.findall(r"^\[p0\] step (\d+)/", out.getvalue(), re.M)
    for minute in (0, 1):
        in_it = [s for s in shown if minute * 60 <= (steps.index(int(s)) / 3.0 if int(s) in steps
                                                     else 120) < (minute + 1) * 60]
        assert len(in_it) <= 40, (minute, len(in_it))
    assert 50 <= len(shown) <= 62, len(shown)  # one every 2 s, the first and the last
    assert shown[0] == "10" and shown[-1] == "20000"
    assert out.getvalue().count("step lines on this terminal") == 1  # said once
    console.close()
    logged = (tmp_path / "launcher.log").read_text()
    assert len(re.findall(r"\[p0\] step \d+/20000", logged)) == len(steps) + 1  # every one kept


def test_piped_every_step_line_is_written():
    out = io.StringIO()
    console = Console(stream=out, show=frozenset({0}), tty=False, clock=lambda: 0.0)
    for step in range(10, 1001, 10):
        console.line("p0", _line(step), 0)
    assert len(re.findall(r"^\[p0\] step ", out.getvalue(), re.M)) == 100
    assert "step lines on this terminal" not in out.getvalue()


def test_other_lines_are_never_held_back():
    now = [0.0]
    held = pace.StepPace(clock=lambda: now[0])
    assert held.admit(0, _line(10)) and not held.admit(0, _line(20))
    assert held.admit(0, "checkpoint of step 20 saved in 0.1 s: /x") and held.admit(1, _line(20))
    assert held.notice() == pace.NOTICE and held.notice() is None


def _tracked(process_id: int, label: str, own_s: float) -> Tracked:
    plan = ProcessPlan(process_id=process_id, host="h", local_device_count=1, env={}, argv=(),
                       log_path="/tmp/x.log", label=label)
    t = Tracked(types.SimpleNamespace(plan=plan), state=State.RUNNING)
    t.stats.observe(wire.Progress(4000, 20000, 0.00886711, 31.6, 0.0316, own_s).text())
    return t


def test_the_progress_line_fits_the_terminal_and_keeps_the_slowest_process_s_name():
    """It was cut at 100 columns just before the slowest process's name."""
    tracked = [_tracked(0, "p0 trainer-host-a.example.internal", 0.0001),
               _tracked(11, "p11 trainer-host-l.example.internal", 0.0123)]
    whole = status_text(tracked, now=None, elapsed_s=3725)
    assert len(whole) > 99
    for columns in (160, 100, 80, 60):
        fitted = status_text(tracked, now=None, elapsed_s=3725, width=columns - 1)
        assert len(fitted) <= columns - 1, (columns, fitted)
        assert fitted.startswith("2/2 running | step 4000/20000 | ETA ")
        assert "loss 0.008867" in fitted
        if columns >= 160:
            assert "slowest p11 trainer-host-l.example.internal" in fitted, fitted
        elif columns >= 80:  # its host given up before its process id
            assert fitted.endswith(" | slowest p11"), fitted
    assert status_text(tracked, elapsed_s=3725, width=300) == whole
