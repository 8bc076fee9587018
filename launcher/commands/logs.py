"""``launch logs RUN [-f] [--process N] [-t]`` and ``launch attach RUN``: a run's log, live.

``logs`` prints the run's ``launcher.log`` (what the console showed: the launcher's
messages, process 0's lines, the progress line every few seconds and the summary), or with
``--process N`` that process's own log of its latest attempt, with ``-n N`` its last N lines;
with ``-f`` it follows the file from its last lines (``FOLLOW_TAIL``, or ``-n N``: as ``tail
-f``) until the run ends and exits with the run's exit code. Each line of the file carries
the UTC time it was written (``launcher.logtimes``): shown with ``-t/--timestamps``, taken
off otherwise, so the lines read as the console showed them. ``attach`` is the console view
of a running run again (no times): the last lines, then everything as it comes, until the
run ends (its exit code) or Ctrl-C (the run goes on); on a terminal the foreground's live
view (``_LiveView``: its progress line redrawn in place, step lines at its pace). Worker text is shown escaped
(``lines.printable``): a log's bytes never drive the terminal.
"""

from __future__ import annotations

import argparse
import codecs
import glob
import os
import re
import shlex
import sys
import time

from launcher import commands, logtimes
from launcher.rundir import names
from launcher.console.lines import printable
from launcher.errors import Problem, SpecError
from worker.contract import runfiles

POLL_S = 0.2
ATTACH_TAIL = 20  # lines of the past that attach shows first
FOLLOW_TAIL = 10  # lines of the past that logs -f shows first, as tail -f
CHUNK_BYTES = 1 << 16  # read at a time: `launch logs` of a 400 MiB log holds about this much
PIECE_BYTES = 1 << 20  # a line longer than this is printed in pieces as it is read
TAIL_MAX_BYTES = 1 << 22  # attach reads back at most this far for its last lines


def parser(prog: str = "logs") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"launch {prog}", description=commands.described(prog))
    parser.add_argument("run", metavar="RUN", help="a run directory, a name `launch runs` "
                        "lists, or a job's name (its newest run"
                        + ("); left out: your newest run of any job" if prog == "logs" else
                           "; its run that is running, where one is)"),
                        **({"nargs": "?", "default": None} if prog == "logs" else {}))
    if prog == "logs":
        parser.add_argument("-f", "--follow", action="store_true",
                            help="follow the log until the run ends, from its last lines (-n, "
                                 f"default {FOLLOW_TAIL}, as tail -f); exit with its exit code")
        parser.add_argument("-n", "--lines", type=int, metavar="N", default=None,
                            help=f"only the last N lines (default: all; with -f {FOLLOW_TAIL})")
        parser.add_argument("--process", type=int, metavar="N",
                            help="process N's own log (its latest attempt's) instead")
        parser.add_argument("-t", "--timestamps", action="store_true",
                            help="lead each line with the UTC time it was written "
                                 "(2026-12-06T07:30:01.123Z)")
    parser.add_argument("--root", metavar="DIR", default=None, help=names.ROOT_HELP)
    return parser


ATTEMPT_DIR = re.compile(r"attempt-(\d+)")  # logs/attempt-N: a restart's logs


def log_file(run_dir: str, process: int | None) -> str:
    """``launcher.log``, or process ``process``'s log of the latest attempt that has one.

    Raises:
      SpecError: no such log (exit 2).
    """
    if process is None:
        path = os.path.join(run_dir, "launcher.log")
    else:
        name = f"process-{process:03d}.log"
        # the run directory's own path may hold glob characters or "attempt-N" itself
        found = [p for p in glob.glob(os.path.join(glob.escape(run_dir), "logs", "attempt-*", name))
                 if ATTEMPT_DIR.fullmatch(os.path.basename(os.path.dirname(p)))]
        attempt = lambda p: int(ATTEMPT_DIR.fullmatch(  # noqa: E731 - by number, not by name
            os.path.basename(os.path.dirname(p))).group(1))
        path = (max(found, key=attempt) if found else os.path.join(run_dir, "logs", name))
    if not os.path.isfile(path):
        raise SpecError([Problem("RUN", None, "", f"{path} is not there (yet)"
                                 + ("" if process is None else ": is --process a process_id of "
                                    "the run?"))])
    return path


class _Shown:
    """A log printed as it is read, in constant memory whatever its size: whole lines as they
    come, each without its time unless ``timestamps``; a line longer than ``PIECE_BYTES``
    (one worker's output line of 64 MiB) printed in pieces as it is read, never held whole."""

    def __init__(self, timestamps: bool = False, sink=None):
        self.timestamps = timestamps
        self.sink = sink  # where the text goes (``_LiveView.write``); None: stdout
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""  # the line still being written (or read): it waits for its end
        self.mid_line = False  # a piece of the pending line was printed already

    def feed(self, chunk: bytes) -> None:
        self.pending += self.decoder.decode(chunk)
        cut = self.pending.rfind("\n")
        if cut >= 0:
            self._write(self.pending[:cut + 1])
            self.pending = self.pending[cut + 1:]
        if len(self.pending) >= PIECE_BYTES:
            self._write(self.pending)
            self.pending = ""

    def finish(self) -> None:
        """The rest (a last line without its newline)."""
        self.pending += self.decoder.decode(b"", final=True)
        if self.pending or self.mid_line:
            self._write(self.pending + "\n")
            self.pending = ""

    def _write(self, text: str) -> None:
        if not self.timestamps:  # a line's time is at its start, never inside a piece's
            head, newline, rest = text.partition("\n") if self.mid_line else ("", "", text)
            text = head + newline + logtimes.unstamped(rest)
        if self.sink is not None:
            self.sink(printable(text, keep_newlines=True))
        else:
            sys.stdout.write(printable(text, keep_newlines=True))
            sys.stdout.flush()
        self.mid_line = not text.endswith("\n")


def _drain(f, shown: _Shown) -> bool:
    """Print what ``f`` holds from where it is to its end, a chunk at a time; whether
    anything was read."""
    got = False
    while True:
        chunk = f.read(CHUNK_BYTES)
        if not chunk:
            return got
        got = True
        shown.feed(chunk)


def tail_offset(f, lines: int) -> int:
    """Where the last ``lines`` whole lines of the binary file ``f`` begin (a line still being
    written after them is not counted), reading back from its end no more than
    ``TAIL_MAX_BYTES``: lines longer than that start their tail inside a line."""
    size = f.seek(0, os.SEEK_END)
    window = min(size, CHUNK_BYTES)
    while True:
        start = size - window
        f.seek(start)
        data = f.read(window)
        at = data.rfind(b"\n")
        for _ in range(lines):
            if at < 0:
                break
            at = data.rfind(b"\n", 0, at)
        if at >= 0:
            return start + at + 1
        if start == 0:
            return 0
        if window >= TAIL_MAX_BYTES:
            first = data.find(b"\n")
            return start + first + 1 if 0 <= first < len(data) - 1 else start
        window = min(size, window * 4, TAIL_MAX_BYTES)


STATUS_LINE = re.compile(r"^podlaunch: \d+/\d+ running(?: \||$)")  # launcher.log's progress line
LABEL = re.compile(r"^\[([^\]]+)\] ")  # a worker line's "[p0] "


class _LiveView:
    """``launch attach`` on a terminal: the foreground launch's view. The run's lines above a
    progress line redrawn in place (``console.StatusLine``) from what its supervisor says now
    (``console.STATUS_FILE``, every second; launcher.log's own progress lines are left out),
    step lines at the foreground's pace (``console.pace``)."""

    def __init__(self, run_dir: str):
        from launcher.console import STATUS_FILE, StatusLine
        from launcher.console.pace import StepPace

        self.live, self.pace = StatusLine(sys.stdout, tty=True), StepPace()
        self.status_file = os.path.join(run_dir, STATUS_FILE)

    def write(self, text: str) -> None:
        shown = []
        for line in text.splitlines(keepends=True):
            body = line.rstrip("\n")
            if STATUS_LINE.match(body):
                continue
            label = LABEL.match(body)
            if label and not self.pace.admit(label.group(1), body[label.end():]):
                said = self.pace.notice()
                if said is not None:
                    shown.append(f"podlaunch: {said}\n")
                continue
            shown.append(line)
        if shown:
            self.live.write("".join(shown))

    def refresh(self) -> None:
        """Redraw the progress line from the supervisor's status file, if there is one."""
        from launcher.console import width
        from launcher.console.status import fit

        try:
            text = runfiles.read_regular(self.status_file, limit=4096).strip()
        except OSError:  # none yet, or gone at the run's end
            return
        if text and "\n" not in text:
            self.live.update(fit(printable(text), width.columns() - 1))

    def end(self) -> None:
        self.live.end()


def follow(run_dir: str, path: str, name: str, tail: int | None = None,
           timestamps: bool = False, start: int | None = None, live: bool = False) -> int:
    """Print ``path`` (its last ``tail`` lines when given; from byte ``start`` when given: what
    this terminal showed already is not shown again), then what comes, until no supervisor
    holds the run; returns the run's exit code. The file is opened without following a link
    and only as the user's own (``runfiles.opener``), and read a chunk at a time (``_Shown``:
    constant memory whatever the log's size). ``live``: the foreground's view on a terminal
    (``_LiveView``)."""
    view = _LiveView(run_dir) if live else None
    shown = _Shown(timestamps, view.write if view else None)
    with _open_log(path) as f:
        if start is not None:
            f.seek(start)
        elif tail is not None:
            f.seek(tail_offset(f, tail))
        _drain(f, shown)  # a line still being written waits for its end (its time is whole)
        while True:
            alive = names.state(run_dir)[1]  # read before the file: its last lines come first
            got = _drain(f, shown)
            if not alive:
                _drain(f, shown)
                shown.finish()
                if view is not None:
                    view.end()
                return names.final_code(run_dir, name)
            if view is not None:
                view.refresh()
            if not got:
                time.sleep(POLL_S)


def main(argv: list) -> int:
    """``launch logs``: 0 once printed; with ``-f`` the run's exit code.

    Raises:
      SpecError: no such run or log (exit 2), at once.
    """
    args = parser("logs").parse_args(argv)
    if args.lines is not None and args.lines < 0:
        raise SpecError([Problem("-n", None, "", f"expected a number of lines >= 0, got "
                                 f"{args.lines}")])
    run_dir = names.resolve(args.run, args.root)
    if args.run is None:  # which run "your newest" was, beside the log (stderr)
        print(f"launch logs: {run_dir}", file=sys.stderr, flush=True)
    path = log_file(run_dir, args.process)
    if args.follow:
        try:
            return follow(run_dir, path, args.run or run_dir, timestamps=args.timestamps,
                          tail=FOLLOW_TAIL if args.lines is None else args.lines)
        except KeyboardInterrupt:
            print(f"launch logs: interrupted; the run in {run_dir} goes on")
            return 130
    shown = _Shown(args.timestamps)
    with _open_log(path) as f:
        if args.lines is not None:
            f.seek(tail_offset(f, args.lines))
        _drain(f, shown)
    shown.finish()
    return 0


def _open_log(path: str):
    """``path`` open for reading (binary: ``_Shown`` decodes it), never through a link nor
    another user's file.

    Raises:
      SpecError: it is a link, not the user's own, or cannot be read (one sentence, exit 2).
    """
    try:
        return open(path, "rb", opener=runfiles.opener)
    except OSError as exc:
        raise SpecError([Problem("RUN", None, "", exc.strerror or str(exc))]) from None


def attach_parser() -> argparse.ArgumentParser:
    """``launch attach``'s parser (``parser``'s for ``logs``)."""
    return parser("attach")


def attach_main(argv: list) -> int:
    """``launch attach``: the run's exit code, or 0 after Ctrl-C (the run goes on). A detached
    run whose supervisor was killed is taken back first (``launcher.run.adopt``).

    Raises:
      SpecError: no such run, it has ended, or it cannot be taken back (exit 2), at once.
    """
    args = parser("attach").parse_args(argv)
    run_dir = names.resolve(args.run, args.root, names.LIVE)
    value, alive = names.state(run_dir)
    handed: list = []  # where the supervisor that took the run back left this terminal
    if not alive and value in names.EXIT_CODES:
        raise SpecError([Problem("RUN", None, "", f"the run in {run_dir} has ended (state "
                                 f"{value}): `launch logs {shlex.quote(run_dir)}` shows it")])
    if not alive:
        from launcher.run import adopt
        from launcher.rundir import journal

        journal.read(run_dir)  # SpecError: not a detached run's, or not proven; nothing taken
        print(f"launch attach: the run's supervisor is gone; taking the run back ({run_dir})",
              flush=True)
        try:
            code = adopt.spawn(run_dir, handed)
        except KeyboardInterrupt:
            print(f"launch attach: left; the run is being taken back and goes on (`launch attach "
                  f"{shlex.quote(run_dir)}` again)")
            return 0
        if code != 0:  # its own error said why
            if names.state(run_dir)[1]:
                print(f"launch attach: another supervisor took the run back first (named above); "
                      f"`launch attach {shlex.quote(run_dir)}` again views it", flush=True)
            return code
    try:
        return follow(run_dir, log_file(run_dir, None), args.run, tail=ATTACH_TAIL,
                      start=handed[0] if handed else None, live=sys.stdout.isatty())
    except KeyboardInterrupt:
        left = f"launch attach: left; the run goes on (`launch attach {shlex.quote(run_dir)}` again)"
        print(f"\r\x1b[K{left}" if sys.stdout.isatty() else left)  # the progress line erased
        return 0
