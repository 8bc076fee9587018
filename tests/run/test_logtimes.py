"""Every line of a run's log files carries the UTC time it was written, to the millisecond
(issue 49, item 4), and what reads the lines back (the summary, ``launch logs`` without
``--timestamps``, the tests' and benches' readers) sees them as they were said."""

from __future__ import annotations

import datetime
import io
import json
import re

from harness.fakes import FakeClock, FakeWorker, process_plan
from launcher import logtimes
from launcher.commands import logs as logs_command
from launcher.console import Console, lines
from launcher.console.status import summary
from launcher.run import supervise as supervision
from launcher.ends import Exited
from worker.contract import wire

STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z ")  # UTC, milliseconds


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _times(path) -> list:
    """Each line's time in the file at ``path``; fails on a line without one."""
    with open(path, encoding="utf-8", newline="") as f:  # a \r as written
        text = f.read()
    assert text.endswith("\n"), text[-200:]
    found = []
    for line in text[:-1].split("\n"):  # lines end at \n alone: a \r stays inside its line
        match = STAMP.match(line)
        assert match, line[:200]
        found.append(datetime.datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
            tzinfo=datetime.timezone.utc))
        assert logtimes.time_of(line) == found[-1]
    return found


def _within(times: list, before: datetime.datetime, after: datetime.datetime) -> None:
    """Every time is the wall clock's while the lines were written (to the millisecond)."""
    low = before.replace(microsecond=before.microsecond // 1000 * 1000)
    assert times and all(low <= t <= after for t in times), (before, times, after)
    assert times == sorted(times)


def test_each_line_of_a_process_log_has_its_utc_time_and_the_summary_shows_the_lines_as_said(tmp_path):
    clock = FakeClock()
    out = io.StringIO()
    console = Console(out, tty=False, status_every_s=0)
    progress = wire.PROGRESS_FORMAT.format(step=1, num_steps=100, loss=0.5, steps_per_s=10.0,
                                               step_time_s=0.1, own_step_time_s=0.01)
    pieces = [lines.Piece("a" * 70_000), lines.Piece("b" * 70_000)]  # one long line, in parts
    said = [progress, "a line with a \r inside", "".join(pieces) + "c", "failed at step 2: boom"]
    worker = FakeWorker(clock, process_plan(0, str(tmp_path)), exit=Exited(1), exit_at=0.5,
                        lines=[(0.1, progress), (0.2, said[1]), (0.3, pieces[0]), (0.31, pieces[1]),
                               (0.32, "c"), (0.4, said[3])])
    before = _now()
    result = supervision.supervise([worker], 3.0, console, poll_interval_s=0.05, clock=clock,
                                   sleep=clock.sleep)
    after = _now()
    log = worker.plan.log_path
    _within(_times(log), before, after)
    assert len(_times(log)) == len(said)  # a line written in parts has one time, at its start
    assert logtimes.read_text(log).split("\n")[:-1] == said
    # what the user sees has no time: the console, and the summary's last lines of the log
    assert not re.search(r"\d\d:\d\d\.\d{3}Z", out.getvalue())
    text = summary(result)
    assert f"last lines of {log}:" in text, text
    tail = [line for line in text.split(f"last lines of {log}:\n", 1)[1].splitlines()
            if line.startswith("  | ")]
    assert (tail[0], tail[-1]) == (f"  | {progress}", "  | failed at step 2: boom"), text


def test_each_line_of_launcher_log_has_its_utc_time(tmp_path):
    out = io.StringIO()
    console = Console(out, tty=False, status_every_s=0)
    before = _now()
    console.log_to(str(tmp_path / "launcher.log"))
    console.say("attempt 0: starting")
    console.line("p0", "step 1/2 loss 0.5", process_id=0)
    console.block("process  state\np0       succeeded")
    console.close()
    after = _now()
    _within(_times(tmp_path / "launcher.log"), before, after)
    assert logtimes.read_text(tmp_path / "launcher.log") == out.getvalue()  # the console's lines


def _run_dir(tmp_path) -> str:
    """A finished run's directory: its launcher.log and process 0's log, as a launch writes them."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"state": "succeeded"}))
    console = Console(io.StringIO(), tty=False, status_every_s=0)
    console.log_to(str(run_dir / "launcher.log"))
    console.say("attempt 0: starting")
    console.line("p0", "step 1/2 loss 0.5", process_id=0)
    console.say("OK: 1 process succeeded.")
    console.close()
    with open(run_dir / "logs" / "process-000.log", "w") as f:
        f.write(logtimes.stamped("step 1/2 loss 0.5\nstep 2/2 loss 0.25\n"))
    return str(run_dir)


def test_launch_logs_shows_the_lines_as_the_console_did_and_their_times_with_timestamps(tmp_path, capsys):
    run_dir = _run_dir(tmp_path)
    plain = ["podlaunch: attempt 0: starting", "[p0] step 1/2 loss 0.5", "podlaunch: OK: 1 process succeeded."]
    for argv, want in [([], plain), (["-f"], plain),  # -f of an ended run: its lines, then its exit code
                       (["--process", "0"], ["step 1/2 loss 0.5", "step 2/2 loss 0.25"])]:
        assert logs_command.main([run_dir, *argv]) == 0
        assert capsys.readouterr().out.splitlines() == want, argv
        for flag in ("-t", "--timestamps"):
            assert logs_command.main([run_dir, *argv, flag]) == 0
            shown = capsys.readouterr().out.splitlines()
            assert [STAMP.sub("", line) for line in shown] == want, (argv, flag)
            assert all(STAMP.match(line) for line in shown), shown


def test_stamps_go_on_at_line_starts_only_and_come_off_whole_lines_only():
    now_s = datetime.datetime(2026, 12, 6, 7, 30, 1, 123456, tzinfo=datetime.timezone.utc).timestamp()
    assert logtimes.stamp(now_s) == "2026-12-06T07:30:01.123Z "
    at = "2026-12-06T07:30:01.123Z "
    assert logtimes.stamped("one\ntwo\n", now_s=now_s) == f"{at}one\n{at}two\n"
    assert logtimes.stamped("rest of a line\nnext", at_line_start=False, now_s=now_s) == \
        f"rest of a line\n{at}next"
    assert logtimes.stamped("", now_s=now_s) == ""
    assert logtimes.unstamped(f"{at}one\r{at}x\nno time\n{at}three") == f"one\r{at}x\nno time\nthree"
    assert logtimes.time_of("no time") is None
