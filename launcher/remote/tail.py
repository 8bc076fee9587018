"""Whole lines of a file another process appends to, from a byte offset, until its writer is gone.

A detached run's worker writes its output (and its wrapper's control lines) to a file on its
host instead of the supervisor's pipe (``launcher.rundir.journal``), so that nothing it prints
is lost while no supervisor reads; the supervisor reads that file with a ``Tail``, and a
supervisor that takes the run back (``launch attach``) reopens it at the offset the one
before it had read to.
"""

from __future__ import annotations

import codecs
import os
import stat
import time
from typing import Callable, Iterator

POLL_S = 0.05
CHUNK = 1 << 16
PIECE_BYTES = 1 << 16  # of a long line, passed on as it comes (launcher.console.lines.MAX_HELD_BYTES)


def lines(path: str, offset: int, writer_alive: Callable[[], bool],
          poll_s: float = POLL_S, piece_bytes: int = PIECE_BYTES) -> Iterator[tuple]:
    """``(line, end)`` for each whole line of ``path`` after byte ``offset`` (``line`` decoded,
    without its newline; ``end``: the byte offset just past it), waiting for more while
    ``writer_alive()``; once the writer is gone and the file is read to its end, a last line
    without a newline is given as it is, and the iteration ends. Never through a link.

    A line longer than ``piece_bytes`` is never held whole (one output line of 64 MiB): it
    comes as ``(piece, None)`` pairs, each a part of it with more to follow, then its last
    part with its ``end``; memory stays within a few ``piece_bytes`` whatever the line.

    Raises:
      OSError: the file cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        pending, at, ending, in_line = b"", offset, False, False
        decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a character cut in two
        while True:
            chunk = os.read(fd, CHUNK)
            if chunk:
                pending += chunk
                *whole, pending = pending.split(b"\n")
                for line in whole:
                    at += len(line) + 1
                    in_line = False
                    yield decoder.decode(line + b"\n", final=True)[:-1], at
                if len(pending) >= piece_bytes:  # part of a long line: passed on, not held
                    at += len(pending)
                    piece, pending, in_line = decoder.decode(pending), b"", True
                    yield piece, None
                continue
            if ending:  # read to the end after its writer was seen gone
                if pending or in_line:
                    yield decoder.decode(pending, final=True), at + len(pending)
                return
            if not writer_alive():
                ending = True  # what it wrote just before it ended is read first
                continue
            time.sleep(poll_s)
    finally:
        os.close(fd)


def cut(path: str, size: int) -> None:
    """Cut the regular file ``path`` back to ``size`` bytes when it is longer (never through a
    link; a file that is not there or shorter is left as it is)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        found = os.fstat(fd)
        if stat.S_ISREG(found.st_mode) and found.st_size > size >= 0:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)
