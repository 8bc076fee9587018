"""Every command's usage as its parser writes it, the one place it is written.

Two copies are read from it and checked against it (``tests/fitness/test_usage_doc.py``): the
arguments ``launch --help`` lists for each command (``launcher.commands.COMMANDS``, kept in
that table because ``launch --help`` imports no command module) and the block of usage lines
at the top of docs/usage.md and under the README's Usage. ``python -m launcher.commands.usage_doc``
prints the block.

A synopsis is the parser's usage (``argparse``'s ``format_usage``) read back as tokens, its
positional arguments first, without ``[-h]``.
"""

from __future__ import annotations

import re
import sys

from launcher import commands

TOKEN = re.compile(r"\[[^\[\]]*\]|[^\s\[\]]+")  # "[--process N]", "[JOB | RUN_DIR]", "RUN"
LEFT_OUT = ("[-h]", "[--version]")  # every command's -h; the job's --version has its own line
COMMON = "[--root DIR]"  # every run command's, said once in the listing's words
WIDTH = 96  # the block's lines, as docs/usage.md wraps the job's own


def synopsis(name: str) -> list[str]:
    """``launch NAME``'s arguments as tokens, positionals first and ``--root DIR`` last
    (``["RUN", "[-f]", ..., "[--root DIR]"]``);
    ``name`` "launch" is the job's own (``launch JOB.yaml ...``)."""
    parser = commands.parser_of(name)
    parser.usage = None  # the job's parser writes its usage by hand for --help: the options'
    text = parser.format_usage().split(":", 1)[1].strip()
    tokens = [t for t in TOKEN.findall(text[len(parser.prog):]) if t not in LEFT_OUT]
    # the job is optional only beside --resume RUN (launch resume RUN says that form)
    tokens = ["JOB.yaml" if t == "[JOB.yaml]" else t for t in tokens]
    options = [t for t in tokens if t.startswith("[-") and t != COMMON]
    return [t for t in tokens if not t.startswith("[-")] + options + (
        [COMMON] if COMMON in tokens else [])


def listed(name: str) -> str:
    """The arguments ``launch --help`` lists for command ``name``: its synopsis without
    ``--root DIR``."""
    return " ".join(t for t in synopsis(name) if t != COMMON)


def block() -> str:
    """The usage lines of docs/usage.md's first block: the job's (wrapped at ``WIDTH``), each
    command's in ``COMMANDS``' order, and ``launch --version``."""
    lines, line = [], "launch"
    for token in synopsis("launch"):
        if len(line) + 1 + len(token) > WIDTH:
            lines.append(line)
            line = " " * len("launch JOB.yaml")
        line += " " + token
    lines.append(line)
    lines += [" ".join(["launch", name, *synopsis(name)]) for name in commands.COMMANDS]
    return "\n".join([*lines, "launch --version"])


if __name__ == "__main__":
    sys.stdout.write(block() + "\n")
