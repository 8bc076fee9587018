"""``launch COMMAND``: one table (``launcher.commands.COMMANDS``) that ``--help`` lists and the
CLI dispatches on; a job file still needs no command word; a mistyped command is bad input."""

from __future__ import annotations

import subprocess

from harness.helpers import LAUNCH, REPO, env_for_tests
from launcher import commands


def _launch(*args, cwd=REPO):
    return subprocess.run(LAUNCH + list(args), cwd=cwd, env=env_for_tests(), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_help_lists_every_command_of_the_table_once():
    shown = _launch("--help")
    assert shown.returncode == 0, shown.stderr
    listed = [line.split()[1] for line in shown.stdout.split("commands (", 1)[1].splitlines()[1:]
              if line.startswith("  ") and not line.startswith("      ")]
    assert listed == list(commands.COMMANDS)
    for name in commands.COMMANDS:  # each answers its own --help
        own = _launch(name, "--help")
        assert own.returncode == 0 and f"launch {name}" in own.stdout, (name, own.stderr)


def test_a_mistyped_command_gets_a_did_you_mean_and_exit_2(tmp_path):
    typo = _launch("rnus", cwd=str(tmp_path))
    assert typo.returncode == 2, typo.stderr
    assert "did you mean `launch runs`?" in typo.stderr and "Traceback" not in typo.stderr
    assert "did you mean `launch stop`" in _launch("stpo", cwd=str(tmp_path)).stderr
    # a job file is a job, whatever its name resembles
    (tmp_path / "stpo").write_text("name: x\n")
    as_job = _launch("stpo", cwd=str(tmp_path))
    assert as_job.returncode == 2 and "did you mean" not in as_job.stderr, as_job.stderr
    missing = _launch("rnus.yaml", cwd=str(tmp_path))
    assert missing.returncode == 2 and "rnus.yaml" in missing.stderr
    assert "did you mean" not in missing.stderr


def test_the_main_command_needs_no_command_word():
    plan = _launch("jobs/linear.yaml", "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "process_id" in plan.stdout or "p0" in plan.stdout, plan.stdout[-2000:]
