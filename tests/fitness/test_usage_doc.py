"""Each command's usage is written once, by its parser: the arguments ``launch --help`` lists
and the blocks of usage lines of docs/usage.md and the README are copies read from it
(``launcher.commands.usage_doc``), and stay so."""

import os
import subprocess
import sys

import pytest

from launcher import commands
from launcher.commands import usage_doc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("name", list(commands.COMMANDS))
def test_the_arguments_launch_help_lists_are_the_parsers(name):
    assert commands.COMMANDS[name][1] == usage_doc.listed(name), (
        f"launcher/commands/__init__.py COMMANDS[{name!r}]: write the parser's "
        f"{usage_doc.listed(name)!r}")


def test_every_command_takes_root_as_the_listing_says():
    for name in commands.COMMANDS:
        assert usage_doc.synopsis(name)[-1] == usage_doc.COMMON, name


def test_the_usage_block_of_docs_usage_md_is_the_parsers():
    with open(os.path.join(REPO, "docs", "usage.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("```\n") + 4
    assert text[start:text.index("```\n", start)] == usage_doc.block() + "\n", (
        "docs/usage.md: paste the output of python -m launcher.commands.usage_doc")


def test_the_usage_block_of_the_readme_is_the_parsers():
    """Issue 70: the README's own block lacked ``why``, ``logs -t`` and tensorboard's
    ``--host``/``--port``; it is the parsers' block too."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("```\n", text.index("\n## Usage\n")) + 4
    assert text[start:text.index("```\n", start)] == usage_doc.block() + "\n", (
        "README.md's Usage: paste the output of python -m launcher.commands.usage_doc")


def test_a_synopsis_is_read_from_the_parser_not_written_beside_it():
    # the job's own: positionals first, no -h, --version on a line of its own
    tokens = usage_doc.synopsis("launch")
    assert tokens[0] == "JOB.yaml" and "[--cluster FILE]" in tokens and "[-h]" not in tokens
    assert "[--version]" not in tokens and usage_doc.block().endswith("\nlaunch --version")
    assert usage_doc.synopsis("logs") == ["[RUN]", "[-f]", "[-n N]", "[--process N]", "[-t]", "[--root DIR]"]
    printed = subprocess.run([sys.executable, "-m", "launcher.commands.usage_doc"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0 and printed.stdout == usage_doc.block() + "\n", printed.stderr
