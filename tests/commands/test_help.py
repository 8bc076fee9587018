"""Help that reads as text (issue 50, item 8): every command's ``--help`` is plain text (no
reStructuredText from a docstring), and docs/usage.md's synopsis names every command with
every option its ``--help`` shows."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from harness.helpers import LAUNCH, REPO, env_for_tests

from launcher import commands


def _help(*argv) -> str:
    done = subprocess.run(LAUNCH + list(argv) + ["--help"], cwd=REPO, env=env_for_tests(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("name", list(commands.COMMANDS))
def test_every_command_s_help_is_plain_text(name):
    text = _help(name)
    assert "``" not in text and not re.search(r"::\s*$|^\.\. ", text, re.M), text


def _synopsis() -> list:
    with open(os.path.join(REPO, "docs", "usage.md"), encoding="utf-8") as f:
        block = f.read().split("```")[1]
    return [line.strip() for line in block.splitlines() if line.strip()]


@pytest.mark.parametrize("name", list(commands.COMMANDS))
def test_the_usage_synopsis_names_every_command_with_its_options(name):
    lines = [line for line in _synopsis() if line.split()[:2] == ["launch", name]]
    assert len(lines) == 1, _synopsis()
    usage = " ".join(_help(name).split("\n\n")[0].split())
    options = set(re.findall(r"\[(--[a-z][a-z-]*|-[a-z])\b", usage)) - {"-h"}
    missing = [option for option in options if option not in lines[0].split()
               and f"[{option}" not in lines[0]]
    assert not missing, (lines[0], usage)


def test_a_bare_launch_says_what_it_takes_and_lists_every_command():
    # a new user's first try: `launch` alone said only that JOB.yaml is required
    done = subprocess.run(LAUNCH, cwd=REPO, env=env_for_tests(), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("usage: launch JOB.yaml [options]"), done.stderr
    listed = re.findall(r"^  (\w+) {2,}\S", done.stderr, re.M)
    assert listed == list(commands.COMMANDS), done.stderr
    assert "launch --help: every option" in done.stderr and "Traceback" not in done.stderr
