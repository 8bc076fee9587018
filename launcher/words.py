"""How the launcher words counts and durations (the shared vocabulary of every message)."""

from __future__ import annotations

import shlex
import sys

# where the words podlaunch's messages use are explained (goodput, badput, attempt, ...)
GLOSSARY = "docs/glossary.md"


def pip_install(extra: str) -> str:
    """The command that installs podlaunch's ``extra`` (``tensorboard``, ``profile``) from its
    checkout into the Python running this launcher: its own ``-m pip``, so it lands in the
    venv whether or not the venv is activated (a plain ``pip`` may be the system's)."""
    return f"{shlex.quote(sys.executable)} -m pip install -e '.[{extra}]'"


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 process``, ``2 processes``: the count and the word that agrees with it."""
    if count == 1:
        return f"{count} {word}"
    return f"{count} {words or (word + 'es' if word.endswith(('s', 'sh', 'ch', 'x')) else word + 's')}"


def duration(seconds: float) -> str:
    """``7.4s``, ``42s``, ``3m05s``, ``2h07m``: short, and tenths only under 10 s."""
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f}s"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
