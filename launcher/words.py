"""How the launcher words counts and durations (the shared vocabulary of every message)."""

from __future__ import annotations

import shlex
import sys

# where the words podlaunch's messages use are explained (goodput, badput, attempt, ...)
GLOSSARY = "docs/glossary.md"


def pip_install(*packages: str) -> str:
    """The command that installs ``packages`` (``tensorboard``, ``xprof``) from PyPI into the
    Python running this launcher, typed in any directory: its own ``-m pip``, so it lands in
    the venv whether or not the venv is activated (a plain ``pip`` may be the system's), and
    no ``-e '.[extra]'``, which works only in podlaunch's checkout."""
    return f"{shlex.quote(sys.executable)} -m pip install " + " ".join(map(shlex.quote, packages))


def missing(module: str, package: str | None = None) -> str | None:
    """``pip_install(package)`` when ``module`` cannot be imported by this launcher's Python
    (nothing is imported), else None: the install to say before the command that needs it."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules
        found = False
    return None if found else pip_install(package or module)


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
