"""``launch why RUN [--attempt N]``: why a run's attempts failed, each as its launcher said it
when it ended (its verdict: the process that failed first, how, its class and what followed)
and the last lines of that process's log.

Read from the run's own files: the verdicts from ``launcher.log`` (every ``attempt N
failed: ...`` line the supervisors wrote, a take-back's included), the lines from the failed
process's log of that attempt (``logs/process-NNN.log`` for attempt 0, ``logs/attempt-N/``
after). ``launch runs`` shows the class only; this says the rest.
"""

from __future__ import annotations

import argparse
import os
import re

from launcher import commands, logtimes, owned
from launcher.console.lines import printable
from launcher.errors import Problem, SpecError
from launcher.rundir import names
from worker.contract import runfiles

VERDICT = re.compile(r"^(?:podlaunch: )?(attempt (?P<attempt>\d+)(?: \([^)]*\))? failed: "
                     r"process_id (?P<process_id>\d+) .*)$")
TAIL_LINES = 12


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch why", description=commands.described("why"))
    parser.add_argument("run", metavar="RUN", nargs="?", default=None,
                        help="a run directory, a name `launch runs` lists, or a job's name (its "
                        "newest failed run); left out: your newest failed run of any job")
    parser.add_argument("--attempt", type=int, default=None, metavar="N",
                        help="only attempt N (default: every failed attempt)")
    parser.add_argument("--root", metavar="DIR", default=None, help=names.ROOT_HELP)
    return parser


def failures(run_dir: str) -> list:
    """``[(attempt, process_id, verdict)]`` of every failed attempt ``launcher.log`` names, in
    order, each attempt once (its last verdict: a take-back may say it again)."""
    try:
        text = logtimes.unstamped(runfiles.read_regular(os.path.join(run_dir, "launcher.log")))
    except OSError:
        return []
    found: dict = {}
    for line in text.splitlines():
        match = VERDICT.match(line)
        if match:
            found[int(match["attempt"])] = (int(match["attempt"]), int(match["process_id"]),
                                            match.group(1))
    return [found[k] for k in sorted(found)]


def _tail(path: str, size: int = 1 << 16) -> list:
    """The last ``TAIL_LINES`` lines of the log ``path`` (its last ``size`` bytes read, never
    through a link), times taken off."""
    with open(path, "rb", opener=runfiles.opener) as f:
        f.seek(0, os.SEEK_END)
        start = max(0, f.tell() - size)
        f.seek(start)
        lines = f.read().decode("utf-8", "replace").splitlines()
    if start:
        lines = lines[1:]  # the first is cut
    return [logtimes.unstamped(line) for line in lines[-TAIL_LINES:]]


def log_of(run_dir: str, attempt: int, process_id: int) -> str:
    """The log of ``process_id`` in ``attempt`` (``launcher.plan``'s layout)."""
    name = f"process-{process_id:03d}.log"
    return os.path.join(run_dir, "logs", name) if attempt == 0 else \
        os.path.join(run_dir, "logs", f"attempt-{attempt}", name)


def main(argv: list) -> int:
    """Print why each failed attempt of RUN failed; returns 0 (1 when none failed).

    Raises:
      SpecError: no such run, another user's, or no attempt ``--attempt`` that failed (exit 2).
    """
    args = parser().parse_args(argv)
    run_dir = names.resolve(args.run, args.root, names.FAILED)
    owned.check_dir(run_dir, "RUN")
    if args.run is None:  # say which run "your newest failed one" was
        print(f"launch why: {run_dir}")
    found = failures(run_dir)
    if args.attempt is not None:
        chosen = [f for f in found if f[0] == args.attempt]
        if not chosen:
            failed = ", ".join(str(f[0]) for f in found) or "none"
            raise SpecError([Problem("--attempt", None, "", f"attempt {args.attempt} of the run "
                                     f"in {run_dir} did not fail (failed attempts: {failed})")])
        found = chosen
    if not found:
        print(f"launch why: no attempt of the run in {run_dir} failed "
              f"(state {names.state(run_dir)[0] or 'unknown'})")
        return 1
    for attempt, process_id, verdict in found:
        print(verdict)
        path = log_of(run_dir, attempt, process_id)
        try:
            tail = _tail(path)
        except OSError as exc:
            print(f"  (its log {path} cannot be read: {exc.strerror})")
            continue
        print(f"  last lines of {path}:")
        for line in tail:
            print(f"  | {printable(line)}")
    return 0
