"""A process's log file, written by its reader thread (``launcher.run.supervise``)."""

from __future__ import annotations

import threading
import time
from typing import Callable

from launcher import logtimes
from worker.contract import causes, runfiles


class LogFile:
    """A process's log file that never stops its reader: a write the disk refuses (full, a
    quota) is said once, and the lines go on to the console and the summary's tail.

    Lines reach the file at once when they come one by one, and at most ``FLUSH_S`` late
    when they come faster (a flush per line was the launcher's largest cost for a process
    that prints many lines: bench/bench_lines.py); ``flush_pending``, called by the
    supervision loop every poll, writes out what a burst left behind.
    """

    FLUSH_S = 0.05

    def __init__(self, path: str, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.path, self.say, self.clock = path, say, clock
        self.failed = False
        self.lock = threading.Lock()  # the reader writes, the supervision loop flushes
        self.pending = False
        self.flushed_at = -float("inf")
        self.at_line_start = True  # the next text begins a line (it gets a time)
        try:  # mode 0600: a worker's output may hold secrets (a printed environment, a URL)
            self.file = open(path, "a", encoding="utf-8", errors="replace", opener=runfiles.opener)
        except (runfiles.LinkRefused, runfiles.NotOwned):
            raise  # a file planted in the run directory: refused, never written through
        except OSError as exc:  # the reader goes on without it: the console and the tail
            self.file = None
            self._failed(exc, "open")

    def write(self, text: str, flush: bool = True) -> None:
        if self.failed:
            return
        with self.lock:
            try:
                self.file.write(logtimes.stamped(text, self.at_line_start))
                if text:
                    self.at_line_start = text.endswith("\n")
                now = self.clock()
                if flush and now - self.flushed_at >= self.FLUSH_S:
                    self.file.flush()
                    self.flushed_at, self.pending = now, False
                else:
                    self.pending = True
            except OSError as exc:
                self._failed(exc)

    def flush_pending(self) -> None:
        """Write out lines a burst left in the buffer (the supervision loop, every poll)."""
        if not self.pending or self.failed:
            return
        with self.lock:
            try:
                self.file.flush()
                self.flushed_at, self.pending = self.clock(), False
            except OSError as exc:
                self._failed(exc)
            except ValueError:  # closed by its reader meanwhile (it flushed on close)
                self.pending = False

    def flushed_size(self) -> int | None:
        """Flush, then the file's size: every line written so far is within it, and it ends
        at the end of a line (a supervisor that takes the run back cuts the log there and
        reads the rest again from the process's output: ``launcher.rundir.journal``); None when
        the file cannot be written or is closed."""
        if self.file is None:
            return None
        with self.lock:
            try:
                self.file.flush()
                self.flushed_at, self.pending = self.clock(), False
                return self.file.buffer.tell()
            except (OSError, ValueError):
                return None

    def _failed(self, exc: OSError, what: str = "write") -> None:
        self.failed = True
        why = causes.exhausted(exc) or exc.strerror
        self.say(f"podlaunch: cannot {what} {self.path} ({why}); this process's "
                 "further lines reach the console only")

    def __enter__(self) -> "LogFile":
        return self

    def __exit__(self, *exc) -> None:
        if self.file is None:
            return
        with self.lock:
            try:
                self.file.close()
            except OSError as exc:  # what the buffer still held could not be written
                if not self.failed:
                    self._failed(exc)
