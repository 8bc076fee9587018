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
