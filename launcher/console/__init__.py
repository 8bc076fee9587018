"""The console: worker lines worth seeing, launcher messages and the live progress view.

One sink for everything the user sees while a run goes on. ``NullConsole``
takes the same calls and shows nothing (tests, the dry run's internals), so
no caller branches on whether there is a console.

The console may go away while a run goes on: a closed terminal (writes fail
with EIO), ``launch job.yaml | head -5`` (EPIPE). A failed write never ends
supervision: the console switches to log-only mode (nothing more is written
to the stream, whose descriptor is pointed at /dev/null so the interpreter's
last flush cannot fail either) and the run goes on. Launcher messages and the
summary also go to the run directory's ``launcher.log`` (``log_to``), so they
are kept whatever happened to the console.

What reaches it of a worker's lines (``launcher.console.lines`` says which line is
which; every line is in the process's log file regardless):

* every line, but library noise, of the processes ``show`` names (the
  CLI's default: process 0, so a step is shown once, not once per process); on a
  terminal their step lines at a pace a person reads (``launcher.console.pace``);
* from the others only notable lines (warnings, errors, tracebacks), and,
  once an attempt is over, the last lines of one that failed and that the
  summary does not already show (``attempt_over``).
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from typing import Callable, TextIO

from launcher import logtimes
from launcher.console import lines as kinds
from launcher.console import width
from launcher.console.pace import StepPace
from launcher.state import State
from launcher.console.status import status_text
from launcher.words import plural
from worker.contract import runfiles, wire
from worker.contract import notice

CLEAR_LINE = "\r\x1b[K"  # carriage return, then erase to the end of the line (ANSI EL)
HIDDEN_TAIL = 5  # a failed process's last lines kept, to show once it failed
LOG_STATUS_EVERY_S = 10.0  # the progress line in launcher.log: when did the run stop moving
STATUS_FILE = "status.txt"  # the progress line now, for launch attach (beside launcher.log)
STATUS_FILE_EVERY_S = 1.0


# How a worker's failure sentence starts: the loop's "failed at step N: ..." and worker/trainer/main.py's
# "worker: ..." (a contract error, bad data, a full disk, a checkpoint that cannot be used)
FAILURE_HEADS = (wire.FAILED_PREFIX, "worker: ")


class Console:
    """Writes worker lines, launcher messages and the status line to one stream.

    Args:
      stream: where everything goes (default: ``sys.stdout`` as it is when the console is made).
      show: process_ids whose every line is written (None: all); their log files get every line anyway.
      others: whether the other processes' notable lines (warnings, errors) are written too.
      status_every_s: seconds between plain status lines when ``stream`` is not a terminal (0 = never).
      tty: redraw the status line in place; default: ``stream.isatty()``.
      clock: seconds, monotonic (the clock ``supervise`` reads, for the ETA and the elapsed time).
    """

    def __init__(self, stream: TextIO | None = None, show: frozenset | None = None,
                 status_every_s: float = 5.0, tty: bool | None = None, others: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        stream = sys.stdout if stream is None else stream  # as it is now, not at import
        self.stream = stream
        self.show = show
        self.others = others
        self.clock = clock
        self.started = clock()
        self.live = StatusLine(stream, tty=tty, status_every_s=status_every_s, clock=clock,
                               on_lost=self._lost)
        self._attention: dict = {}  # process_id -> lines.Attention
        self._hidden: dict = {}     # process_id -> deque of its last lines not shown
        self._interrupt: str | None = None  # how the launcher itself stops the run (interrupted)
        self._notable_shown: dict = {}  # a notable line -> the process that said it first
        self._same_failure: set = set()  # processes whose failure line repeated another's
        self.log = None          # the run directory's launcher.log, once ``log_to`` opened it
        self._log_lock = threading.Lock()
        self._logged_status_at = -float("inf")
        self.pace = StepPace(clock)  # a terminal's step lines, at a pace a person reads
        self._status_file = None  # STATUS_FILE, once ``log_to`` named the run directory
        self._status_written_at = -float("inf")
        # called with (tracked, now) at every status refresh, each rate-limiting itself:
        # run.json's progress (launch runs), a detached launch's hand-off
        self.watchers: list = []

    def log_to(self, path: str) -> None:
        """Also append launcher messages and the summary to ``path`` (the run's launcher.log)."""
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.log = open(path, "a", encoding="utf-8", errors="replace", opener=runfiles.opener)
        self._status_file = os.path.join(os.path.dirname(path) or ".", STATUS_FILE)
        if self.live.lost is not None:
            self._log_text(f"podlaunch: {self.live.lost}\n")

    def _log_text(self, text: str) -> None:
        with self._log_lock:
            if self.log is None:
                return
            try:
                self.log.write(logtimes.stamped(text))  # every line led by its UTC time
                self.log.flush()
            except (OSError, ValueError):  # a full disk must not end supervision either
                pass

    def _lost(self, why: str) -> None:
        self._log_text(f"podlaunch: {why}\n")

    @property
    def lost(self) -> str | None:
        """Why the console stream went away (log-only mode), or None while it works."""
        return self.live.lost

    def interrupted(self, how: str) -> None:
        """The launcher itself stops the run (``how``: ``Ctrl-C``, ``SIGTERM``, ...): its SIGTERM
        reaches the workers as a preemption notice, and their lines about it are shown as the
        interrupt it is (their log files keep the worker's words)."""
        self._interrupt = how

    def line(self, label: str, text: str, process_id: int | None = None) -> None:
        text = kinds.printable(text)  # a worker's bytes never drive the terminal
        if self._interrupt and text.startswith(notice.PREFIX):
            text = f"interrupt ({self._interrupt}):" + text.split(":", 1)[1]
        if process_id is None:  # the launcher's own line about a process
            self.live.write(f"[{label}] {text}\n")
            return
        if kinds.is_noise(text):
            return
        if process_id == 0:  # launcher.log keeps process 0's lines: a detached run's log
            self._log_text(f"[{label}] {text}\n")
        notable = self._attention.setdefault(process_id, kinds.Attention())(text)
        hidden_process = self.show is not None and process_id not in self.show
        if notable and hidden_process and kinds.is_consequence_chatter(text):
            notable = False  # another process's failure, retold by JAX in every other process
        shown, failure = True, text.startswith(FAILURE_HEADS)
        if notable or failure:  # a copy of a line another process said (every process's
            # "failed at step 9: loss is inf") is said once
            repeated = self._notable_shown.get(text, process_id) != process_id
            if len(self._notable_shown) < 10_000:
                self._notable_shown.setdefault(text, process_id)
            notable = notable and not (repeated and self.show is not None
                                       and process_id not in self.show)
            shown = not (repeated and failure)
            if not shown:
                self._same_failure.add(process_id)
                return
        if shown and (self.show is None or process_id in self.show or (self.others and notable)):
            if self.live.tty and not self.pace.admit(process_id, text):
                said = self.pace.notice()  # once; launcher.log keeps every line
                if said is not None:
                    self.live.write(self._fitted(f"podlaunch: {said}") + "\n")
                return
            line = f"[{label}] {text}"
            self.live.write((width.worker_line(line, width.columns()) if self.live.tty
                             else line) + "\n")
        else:
            self._hidden.setdefault(process_id, collections.deque(maxlen=HIDDEN_TAIL)).append(
                (label, text))

    def say(self, text: str) -> None:
        self.live.write(self._fitted(f"podlaunch: {kinds.printable(text, keep_newlines=True)}")
                        + "\n")
        self._log_text(f"podlaunch: {text}\n")

    def block(self, text: str) -> None:
        """A finished block of lines (the summary): to the console and to launcher.log.

        Worker text in it (log tails) is shown escaped (``lines.printable``)."""
        self.live.write(self._fitted(kinds.printable(text, keep_newlines=True)) + "\n")
        self._log_text(text + "\n")

    def _fitted(self, text: str) -> str:
        """On a terminal, the launcher's sentences wrapped to its width (``console.width``)."""
        return width.fitted(text, width.columns()) if self.live.tty else text

    def close(self) -> None:
        if self._status_file is not None:  # the run's end: no progress line to show
            try:
                os.unlink(self._status_file)
            except OSError:
                pass
        with self._log_lock:
            if self.log is not None:
                try:
                    self.log.close()
                except OSError:  # its last lines met a full disk: said when they were written
                    pass
                self.log = None

    def status(self, tracked: list) -> None:
        """Refresh the status line from the tracked processes (rate-limited)."""
        now = self.clock()
        for watcher in list(self.watchers):
            watcher(tracked, now)
        to_log = self.log is not None and now - self._logged_status_at >= LOG_STATUS_EVERY_S
        to_file = (self._status_file is not None
                   and now - self._status_written_at >= STATUS_FILE_EVERY_S)
        if not self.live.due() and not to_log and not to_file:  # it walks every process
            return
        text = status_text(tracked, now=now, elapsed_s=now - self.started)
        if to_file:  # launch attach's progress line, redrawn as the foreground's is
            self._status_written_at = now
            try:
                runfiles.write_whole(self._status_file, text + "\n")
            except OSError:
                pass
        self.live.update(status_text(tracked, now=now, elapsed_s=now - self.started,
                                     width=width.columns() - 1) if self.live.tty else text)
        if to_log:
            self._logged_status_at = now
            self._log_text(f"podlaunch: {text}\n")

    def end_status(self) -> None:
        """Take the status line off the terminal."""
        self.live.end()

    def attempt_over(self, result) -> None:
        """An attempt ended (``state.Result``): show the last lines, not shown so far, of
        each process that failed by itself, except the first failure (the summary leads
        with its log's tail); then forget this attempt's lines."""
        for t in result.processes:
            kept = self._hidden.get(t.plan.process_id)
            if t.state is not State.FAILED or t is result.first_failure or not kept:
                continue
            if t.plan.process_id in self._same_failure:  # its sentence was said for another
                self.say(f"{t.plan.label} failed too ({t.exit}), with the same words (its log: "
                         f"{t.plan.log_path})")
                continue
            kept = [(label, text) for label, text in kept if not kinds.is_consequence_chatter(text)]
            if not kept:
                continue
            self.say(f"{t.plan.label} failed too ({t.exit}); its last "
                     f"{plural(len(kept), 'line')} not shown above (all in {t.plan.log_path}):")
            for label, text in kept:
                self.live.write(f"[{label}] {text}\n")
        self._hidden.clear()
        self._attention.clear()
        self._same_failure.clear()


class NullConsole(Console):
    """A console that shows nothing."""

    def __init__(self):
        super().__init__(stream=None, tty=False, status_every_s=0)

    def line(self, label: str, text: str, process_id: int | None = None) -> None:
        pass

    def say(self, text: str) -> None:
        pass

    def block(self, text: str) -> None:
        pass

    def status(self, tracked: list) -> None:
        pass

    def end_status(self) -> None:
        pass

    def attempt_over(self, result) -> None:
        pass


class StatusLine:
    """Draws the status line on a terminal, or prints it every few seconds elsewhere.

    Args:
      stream: the console stream.
      tty: redraw in place; default: ``stream.isatty()``.
      status_every_s: seconds between plain status lines when not a terminal (0 = never).
      redraw_every_s: the least seconds between redraws on a terminal.
    """

    def __init__(self, stream: TextIO, tty: bool | None = None, status_every_s: float = 5.0,
                 redraw_every_s: float = 0.2, clock=time.monotonic, on_lost=None):
        self.stream = stream
        self.lost: str | None = None  # why the stream failed; then nothing more is written
        self.on_lost = on_lost
        if tty is None:
            try:
                tty = stream.isatty()
            except (AttributeError, ValueError):
                tty = False
        self.tty = tty
        self.status_every_s = status_every_s
        self.redraw_every_s = redraw_every_s
        self.clock = clock
        self.lock = threading.RLock()
        self._text = ""      # what is (or would be) drawn
        self._drawn = False  # a status line is on the terminal now
        self._last = None    # clock of the last draw or plain line

    def _emit(self, *parts: str) -> None:
        """Write ``parts`` and flush; a failing stream switches to log-only mode, never raises."""
        if self.lost is not None or self.stream is None:
            return
        try:
            for part in parts:
                self.stream.write(part)
            self.stream.flush()
        except (OSError, ValueError) as exc:  # EPIPE (a closed pipe), EIO (a closed terminal)
            self._lose(exc)

    def _lose(self, exc: BaseException) -> None:
        self.lost = (f"the console went away ({type(exc).__name__}: {exc}); the run goes on, "
                     "its messages and summary go to launcher.log in the run directory")
        self._drawn = False
        try:  # the interpreter flushes stdout at exit: let that land in /dev/null, not fail
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass
        if self.on_lost is not None:
            self.on_lost(self.lost)

    def write(self, text: str) -> None:
        """Write finished lines; on a terminal they go above the status line."""
        with self.lock:
            parts = []
            if self._drawn:
                parts.append(CLEAR_LINE)
            parts.append(text)
            if self._drawn:
                parts.append(self._fit(self._text))
            self._emit(*parts)

    def due(self) -> bool:
        """Whether ``update`` may draw now (else it would drop the text unread)."""
        if self.tty:
            return self._last is None or self.clock() - self._last >= self.redraw_every_s
        if self.status_every_s <= 0:
            return False
        return self._last is None or self.clock() - self._last >= self.status_every_s

    def update(self, text: str) -> None:
        """Show ``text`` as the current status (rate-limited)."""
        with self.lock:
            now = self.clock()
            if self.tty:
                if text == self._text and self._drawn:
                    return
                if self._last is not None and now - self._last < self.redraw_every_s:
                    return
                self._text, self._drawn, self._last = text, True, now
                self._emit(CLEAR_LINE + self._fit(text))
                return
            if self.status_every_s <= 0:
                return
            if self._last is None:
                self._last = now  # the first plain line comes after one interval, not at once
                return
            if now - self._last >= self.status_every_s:
                self._last = now
                self._emit(f"podlaunch: status: {text}\n")

    def end(self) -> None:
        """Erase the terminal status line (before the summary is printed)."""
        with self.lock:
            if self._drawn:
                self._emit(CLEAR_LINE)
            self._drawn, self._last, self._text = False, None, ""

    @staticmethod
    def _fit(text: str) -> str:
        # A line wider than the terminal wraps, and \r then redraws only its last row.
        columns = width.columns()
        return text if len(text) < columns else text[:max(columns - 2, 10)] + "…"
