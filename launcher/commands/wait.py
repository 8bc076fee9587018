"""``launch wait RUN [--timeout S]``: wait for a run to end; its exit code, 124 at the timeout.

The run has ended once no supervisor holds its lock (``launcher.rundir.runlock``: the kernel
drops it however the supervisor ends); its exit code is then its run.json state's.
"""

from __future__ import annotations

import argparse
import time

from launcher import commands, flags
from launcher.rundir import names

EXIT_TIMEOUT = 124  # as timeout(1), xpk and Ray say it
POLL_S = 0.2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch wait", description=commands.described("wait"))
    parser.add_argument("run", metavar="RUN", help="a run directory, a name `launch runs` "
                        "lists, or a job's name (its newest run)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="give up after S seconds with exit code 124 (default: no limit)")
    parser.add_argument("--root", default=None, help=names.ROOT_HELP)
    return parser


def main(argv: list) -> int:
    """Returns the run's exit code (0, 1, 130), or 124 when ``--timeout`` passed first.

    Raises:
      SpecError: no such run, or ``--timeout`` not a number of seconds > 0 (exit 2), at once.
    """
    args = _parser().parse_args(argv)
    if args.timeout is not None:  # -3, nan, inf: said, not waited on
        flags.check(("--timeout", args.timeout, flags.seconds, "how long to wait for the run's end"))
    run_dir = names.resolve(args.run, args.root)
    deadline = None if args.timeout is None else time.monotonic() + max(0.0, args.timeout)
    began = time.monotonic()
    if names.state(run_dir)[1]:
        print(f"launch wait: waiting for the run in {run_dir} to end"
              + (f" (at most {args.timeout:g} s)" if args.timeout is not None else ""), flush=True)
    try:
        while names.state(run_dir)[1]:
            if deadline is not None and time.monotonic() >= deadline:
                print(f"launch wait: {run_dir} still running after {args.timeout:g} s")
                return EXIT_TIMEOUT
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        print(f"launch wait: interrupted; the run in {run_dir} goes on")
        return 130
    code = names.final_code(run_dir, args.run)
    value = names.state(run_dir)[0]
    if value in names.EXIT_CODES:
        print(f"launch wait: the run {value} (exit code {code}) after {time.monotonic() - began:.1f} s "
              "of waiting")
    return code
