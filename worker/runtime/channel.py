"""The lines a process tells its launcher (progress, heartbeats, done, how it ended), on a
channel the program cannot redirect: the stdout the process was started with, kept as a
descriptor of its own (``os.dup``, not inherited by the program's children) once ``keep`` is
called. A program that points ``sys.stdout``, or descriptor 1 itself, at a file of its own after
``podlaunch.program.initialize()`` still tells the launcher every step and its end (it trained
every step and was failed as "never said done"). Standard library only.
"""

from __future__ import annotations

import os
import sys

_kept: list = []  # the kept stream, once ``keep`` ran (None in it: stdout was closed)


def keep() -> None:
    """From now on ``say`` writes to stdout as it is now, whatever the program does to it."""
    if _kept:
        return
    try:
        sys.stdout.flush()
        _kept.append(os.fdopen(os.dup(1), "w", encoding="utf-8", errors="replace", buffering=1))
    except (OSError, ValueError, AttributeError):
        _kept.append(None)


def say(text: str) -> None:
    """Write ``text`` and a newline for the launcher, flushed (before ``keep``: to sys.stdout).
    A launcher's end that is gone is the launcher's failure, not the program's: never raises."""
    out = (_kept[0] if _kept else None) or sys.stdout
    try:
        out.write(text + "\n")
        out.flush()
    except (OSError, ValueError, AttributeError):
        pass


def flush() -> None:
    """Flush sys.stdout, sys.stderr and the kept stream (before ``os._exit``); never raises."""
    for stream in (sys.stdout, sys.stderr, *_kept):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
