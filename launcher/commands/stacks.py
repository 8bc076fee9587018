"""``launch stacks RUN``: every process's stacks of a live run, now.

Asks the run's launcher (``run.json``'s ``launcher`` pid, on this machine, signalled only once
proven to hold the run's lock: ``launcher.rundir.runlock.prove``) with
``launcher.interrupts.STACKS_REQUEST_SIGNAL``; the launcher reads every process's
stacks through its backend's transport (``launcher.run.stacks``), writes them beside the
attempt's logs and its answer, ``stacks.json``, which this command waits for (at most
``--timeout-s``) and prints. The run goes on.
"""

from __future__ import annotations

import argparse
import time

from launcher import commands
from launcher import flags, interrupts
from launcher.rundir import names
from launcher.rundir.asked import answers, ask, live_launcher, print_answer
from launcher.errors import LaunchError
from launcher.run import stacks


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch stacks", description=commands.described("stacks"))
    parser.add_argument("run_dir", metavar="RUN", help="the live run: its directory, a name "
                        "`launch runs` lists, or a job's name (its run that is running, else its newest)")
    parser.add_argument("--root", metavar="DIR", default=None, help=names.ROOT_HELP)
    parser.add_argument("--timeout-s", type=float, metavar="SECONDS", default=15.0,
                        help="how long to wait for the launcher's answer (default 15)")
    return parser


def main(argv: list) -> int:
    """Ask, wait, print; returns the exit code.

    Raises:
      SpecError: ``--timeout-s`` is not a number of seconds > 0, or RUN_DIR is not a run
        with a live launcher on this machine (exit 2); nothing was asked.
      LaunchError: the launcher did not answer within ``--timeout-s`` (exit 1).
    """
    args = parser().parse_args(argv)
    flags.check(("--timeout-s", args.timeout_s, flags.seconds, "how long to wait for the answer"))
    run_dir = names.resolve(args.run_dir, args.root, names.LIVE)  # as logs, attach, wait and stop do
    launcher, proven = live_launcher(run_dir, "launch stacks")
    asked_at = time.time()
    ask(proven, interrupts.STACKS_REQUEST_SIGNAL)
    deadline = time.monotonic() + args.timeout_s
    while time.monotonic() < deadline:
        fresh = [a for a in answers(run_dir, stacks.ANSWER_FILE) if a["at"] >= asked_at]
        if fresh:
            print_answer(fresh[0])
            return 0
        time.sleep(0.1)
    raise LaunchError(f"the launcher (pid {launcher['pid']}) did not answer within "
                      f"{args.timeout_s:g} s: it answers while its processes run (not while "
                      "it starts them or waits before a restart); try again")
