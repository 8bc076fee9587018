"""``launch logs RUN --process N`` (``launcher.commands.logs``): which of a run's log files it
shows. A run directory of files as a run leaves them; no run is started."""

from __future__ import annotations

import json

from launcher.commands import logs as logs_command


def test_a_process_s_log_is_that_of_its_latest_attempt_by_number_not_by_name(tmp_path, capsys):
    """A run restarted ten times has ``logs/attempt-2`` and ``logs/attempt-10``: ``--process 0``
    shows attempt 10's log, the latest, though its name sorts before attempt 2's."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"job": "linear", "state": "failed"}))
    for attempt in (1, 2, 10):
        folder = run_dir / "logs" / f"attempt-{attempt}"
        folder.mkdir(parents=True)
        (folder / "process-000.log").write_text(f"attempt {attempt}'s line\n")
    assert logs_command.log_file(str(run_dir), 0) == str(
        run_dir / "logs" / "attempt-10" / "process-000.log")
    assert logs_command.main([str(run_dir), "--process", "0"]) == 0
    assert capsys.readouterr().out == "attempt 10's line\n"


def test_a_run_directory_whose_own_path_says_attempt_or_holds_glob_characters_finds_its_logs(
        tmp_path):
    """The attempt is read from the attempt's own directory's name: a run directory under
    ``.../attempt-99 [x]/`` (its path holding ``attempt-N`` and glob's brackets) still gets
    attempt 10's log, not attempt 2's and not none."""
    run_dir = tmp_path / "attempt-99 [x]" / "run"
    run_dir.mkdir(parents=True)
    for attempt in (2, 10):
        folder = run_dir / "logs" / f"attempt-{attempt}"
        folder.mkdir(parents=True)
        (folder / "process-000.log").write_text(f"attempt {attempt}'s line\n")
    assert logs_command.log_file(str(run_dir), 0) == str(
        run_dir / "logs" / "attempt-10" / "process-000.log")


_PEAK_RSS = """import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)"""


def _stamped_log(path, total_bytes: int, long_line_bytes: int) -> None:
    """A log of ``total_bytes``: stamped lines, one of them ``long_line_bytes`` long."""
    line = b"2026-12-06T07:30:01.123Z [p0] step 10/100 loss 0.5 " + b"x" * 200 + b"\n"
    block = line * (1 << 20 // len(line) + 1)
    with open(path, "wb") as f:
        f.write(b"2026-12-06T07:30:01.123Z " + b"y" * long_line_bytes + b"\n")
        while f.tell() < total_bytes:
            f.write(block)


def test_logs_and_attach_of_a_large_log_and_a_long_line_hold_constant_memory(tmp_path):
    """``launch logs`` (also ``--process``, ``-f`` of an ended run) of a 96 MiB log with one
    32 MiB line peaks under 100 MB (it read the whole file, then a copy without times, then a
    list of its lines: 1.3 GB for a 400 MiB log); the long line is shown whole, its time off."""
    import os
    import subprocess
    import sys

    from harness.helpers import LAUNCH, env_for_tests

    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"job": "linear", "state": "succeeded"}))
    _stamped_log(run_dir / "launcher.log", 96 << 20, 32 << 20)
    os.link(run_dir / "launcher.log", run_dir / "logs" / "process-000.log")
    for extra in ([], ["--process", "0"], ["-f"]):
        peak = subprocess.run([sys.executable, "-c", _PEAK_RSS, *LAUNCH, "logs", str(run_dir),
                               *extra], env=env_for_tests(), capture_output=True, text=True,
                              check=True)
        assert int(peak.stdout) < 100, (extra, peak.stdout)
    shown = subprocess.run([*LAUNCH, "logs", str(run_dir)], env=env_for_tests(),
                           capture_output=True, check=True).stdout
    first = shown[:shown.index(b"\n") + 1]
    assert first == b"y" * (32 << 20) + b"\n"
    assert shown[len(first):].startswith(b"[p0] step 10/100")


def test_attach_shows_the_last_lines_of_a_large_log_reading_back_only_its_end(tmp_path):
    from launcher.commands.logs import tail_offset

    path = tmp_path / "launcher.log"
    path.write_bytes(b"z" * (10 << 20) + b"\n" + b"".join(b"line %d\n" % i for i in range(30))
                     + b"half a line")
    with open(path, "rb") as f:
        f.seek(tail_offset(f, 20))
        assert f.read().splitlines() == [b"line %d" % i for i in range(10, 30)] + [b"half a line"]
        f.seek(tail_offset(f, 40))  # more lines than the 4 MiB read back holds: from a line start
        assert f.read().splitlines()[0] == b"line 0"


def test_logs_n_and_f_start_from_the_last_lines_as_tail_does(tmp_path, capsys):
    """Issue 70, item 2: `launch logs -f` replayed the whole launcher.log (415 lines 30 s into
    a run, thousands on a long one) and had no -n. An ended run's log, so -f returns."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"job": "linear", "state": "succeeded"}))
    (run_dir / "launcher.log").write_text("".join(
        f"2026-12-06T07:30:01.123Z podlaunch: line {n}\n" for n in range(1000)))
    assert logs_command.main([str(run_dir), "-n", "3"]) == 0
    assert capsys.readouterr().out == "podlaunch: line 997\npodlaunch: line 998\npodlaunch: line 999\n"
    assert logs_command.main([str(run_dir), "-f"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown == [f"podlaunch: line {n}" for n in range(990, 1000)]  # tail -f's 10
    assert logs_command.main([str(run_dir), "-f", "-n", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["podlaunch: line 998", "podlaunch: line 999"]
    assert logs_command.main([str(run_dir)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1000  # without -f or -n: all of it
