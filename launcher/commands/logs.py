"""``launch logs RUN [-f] [--process N] [-t]`` and ``launch attach RUN``: a run's log, live.

``logs`` prints the run's ``launcher.log`` (what the console showed: the launcher's
messages, process 0's lines, the progress line every few seconds and the summary), or with
``--process N`` that process's own log of its latest attempt; with ``-f`` it follows the
file until the run ends and exits with the run's exit code. Each line of the file carries
the UTC time it was written (``launcher.logtimes``): shown with ``-t/--timestamps``, taken
off otherwise, so the lines read as the console showed them. ``attach`` is the console view
of a running run again (no times): the last lines, then everything as it comes, until the
run ends (its exit code) or Ctrl-C (the run goes on). Worker text is shown escaped
(``lines.printable``): a log's bytes never drive the terminal.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import time

from launcher import commands, logtimes
from launcher.rundir import names
from launcher.console.lines import printable
from launcher.errors import Problem, SpecError
from worker.contract import runfiles

POLL_S = 0.2
ATTACH_TAIL = 20  # lines of the past that attach shows first


def parser(prog: str = "logs") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"launch {prog}", description=commands.described(prog))
    parser.add_argument("run", metavar="RUN", help="a run directory, a name `launch runs` "
                        "lists, or a job's name (its newest run)")
    if prog == "logs":
        parser.add_argument("-f", "--follow", action="store_true",
                            help="follow the log until the run ends; exit with its exit code")
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


def _show(text: str, timestamps: bool = False) -> None:
    """Print whole lines of a log, each without its time unless ``timestamps``."""
    if not timestamps:
        text = logtimes.unstamped(text)
    for line in text.splitlines():
        print(printable(line), flush=False)
    sys.stdout.flush()


def follow(run_dir: str, path: str, name: str, tail: int | None = None,
           timestamps: bool = False, start: int | None = None) -> int:
    """Print ``path`` (its last ``tail`` lines when given; from byte ``start`` when given: what
    this terminal showed already is not shown again), then what comes, until no supervisor
    holds the run; returns the run's exit code. The file is opened without following a link
    and only as the user's own (``runfiles.opener``)."""
    with _open_log(path) as f:
        if start is not None:
            f.seek(start)
        # a line still being written waits for its end (its time is not cut in two)
        whole, _, pending = f.read().rpartition("\n")
        _show(whole if tail is None or start is not None
              else "\n".join(whole.splitlines()[-tail:]), timestamps)
        while True:
            alive = names.state(run_dir)[1]  # read before the file: its last lines come first
            chunk = f.read()
            if chunk:
                whole, _, pending = (pending + chunk).rpartition("\n")
                _show(whole, timestamps)
            if not alive:
                _show(pending + f.read(), timestamps)
                return names.final_code(run_dir, name)
            if not chunk:
                time.sleep(POLL_S)


def main(argv: list) -> int:
    """``launch logs``: 0 once printed; with ``-f`` the run's exit code.

    Raises:
      SpecError: no such run or log (exit 2), at once.
    """
    args = parser("logs").parse_args(argv)
    run_dir = names.resolve(args.run, args.root)
    path = log_file(run_dir, args.process)
    if args.follow:
        try:
            return follow(run_dir, path, args.run, timestamps=args.timestamps)
        except KeyboardInterrupt:
            print(f"launch logs: interrupted; the run in {run_dir} goes on")
            return 130
    with _open_log(path) as f:
        _show(f.read(), args.timestamps)
    return 0


def _open_log(path: str):
    """``path`` open for reading, never through a link nor another user's file.

    Raises:
      SpecError: it is a link, not the user's own, or cannot be read (one sentence, exit 2).
    """
    try:
        return open(path, "r", encoding="utf-8", errors="replace", opener=runfiles.opener)
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
    run_dir = names.resolve(args.run, args.root)
    value, alive = names.state(run_dir)
    handed: list = []  # where the supervisor that took the run back left this terminal
    if not alive and value in names.EXIT_CODES:
        raise SpecError([Problem("RUN", None, "", f"the run in {run_dir} has ended (state "
                                 f"{value}): `launch logs {args.run}` shows it")])
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
                  f"{args.run}` again)")
            return 0
        if code != 0:  # its own error said why
            if names.state(run_dir)[1]:
                print(f"launch attach: another supervisor took the run back first (named above); "
                      f"`launch attach {args.run}` again views it", flush=True)
            return code
    try:
        return follow(run_dir, log_file(run_dir, None), args.run, tail=ATTACH_TAIL,
                      start=handed[0] if handed else None)
    except KeyboardInterrupt:
        print(f"launch attach: left; the run goes on (`launch attach {args.run}` again)")
        return 0
