"""``launch wait RUN [--timeout-s SECONDS]``: wait for a run to end; its exit code, 124 at the timeout.

The run has ended once no supervisor holds its lock (``launcher.rundir.runlock``: the kernel
drops it however the supervisor ends); its exit code is then its run.json state's. A detached
run whose lock is free while run.json says it runs may be changing hands (``launch attach``
starting the supervisor that takes it back, which holds the lock within a second or two):
that is waited for, up to ``HANDOVER_S``, before the supervisor is called gone.
"""

from __future__ import annotations

import argparse
import os
import time

from launcher import commands, flags
from launcher.rundir import names

EXIT_TIMEOUT = 124  # as timeout(1), xpk and Ray say it
POLL_S = 0.2
HANDOVER_S = 10.0  # how long a detached run's free lock is waited on for a take-back


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch wait", description=commands.described("wait"))
    parser.add_argument("run", metavar="RUN", help="a run directory, a name `launch runs` "
                        "lists, or a job's name (its run that is running, else its newest)")
    parser.add_argument("--timeout-s", "--timeout", dest="timeout_s", type=float, default=None,
                        metavar="SECONDS", help="give up after SECONDS with exit code 124 (default: "
                        "no limit; --timeout, its former name, too)")
    parser.add_argument("--root", metavar="DIR", default=None, help=names.ROOT_HELP)
    return parser


def main(argv: list) -> int:
    """Returns the run's exit code (0, 1, 130), or 124 when ``--timeout-s`` passed first.

    Raises:
      SpecError: no such run, or ``--timeout-s`` not a number of seconds > 0 (exit 2), at once.
    """
    args = parser().parse_args(argv)
    if args.timeout_s is not None:  # -3, nan, inf: said, not waited on
        flags.check(("--timeout-s", args.timeout_s, flags.seconds, "how long to wait for the run's end"))
    run_dir = names.resolve(args.run, args.root, names.LIVE)
    deadline = None if args.timeout_s is None else time.monotonic() + max(0.0, args.timeout_s)
    began = time.monotonic()
    if names.state(run_dir)[1]:
        print(f"launch wait: waiting for the run in {run_dir} to end"
              + (f" (at most {args.timeout_s:g} s)" if args.timeout_s is not None else ""), flush=True)
    try:
        while True:
            while names.state(run_dir)[1]:
                if deadline is not None and time.monotonic() >= deadline:
                    print(f"launch wait: {run_dir} still running after {args.timeout_s:g} s")
                    return EXIT_TIMEOUT
                time.sleep(POLL_S)
            if not _changing_hands(run_dir, deadline):
                break
    except KeyboardInterrupt:
        print(f"launch wait: interrupted; the run in {run_dir} goes on")
        return 130
    code = names.final_code(run_dir, args.run)
    value = names.state(run_dir)[0]
    if value in names.EXIT_CODES:
        print(f"launch wait: the run {value} (exit code {code}) after {time.monotonic() - began:.1f} s "
              "of waiting")
    return code


def _changing_hands(run_dir: str, deadline: float | None) -> bool:
    """Whether a supervisor holds the run again within ``HANDOVER_S`` (or by ``deadline``):
    asked only of a detached run (it keeps a journal: only such a run is taken back) whose
    lock is free while run.json says it runs; its supervisor was killed, and ``launch attach``
    may be taking it back (its new supervisor was still loading: wait said "gone", exit 1)."""
    from launcher.rundir.journal import JOURNAL_FILE

    if names.state(run_dir)[0] != "running" or not os.path.exists(os.path.join(run_dir, JOURNAL_FILE)):
        return False
    end = time.monotonic() + HANDOVER_S
    if deadline is not None:
        end = min(end, deadline)
    while time.monotonic() < end:
        if names.state(run_dir)[1]:
            print(f"launch wait: the run in {run_dir} was taken back by a new supervisor; "
                  "waiting on", flush=True)
            return True
        time.sleep(POLL_S)
    return False
