"""``launch profile RUN [--steps N]``: a ``jax.profiler`` trace of N steps of every process of a live run.

Writes the request (a ``launcher.run.profiles.REQUEST_PREFIX`` file of its own) into the run
directory and signals the run's launcher (run.json's ``launcher`` pid, on this machine) with
``launcher.interrupts.PROFILE_REQUEST_SIGNAL``. The launcher picks the first step, a few
seconds ahead of the furthest process, and hands the window to every process through its
backend (``launcher.run.profiles``); each traces those steps into the run's
``tensorboard/plugins/profile/<session>/`` (copied back from ssh and tpu hosts), where
``launch tensorboard RUN_DIR`` shows them. This waits (at most ``--timeout-s``) for every
trace and prints where they are and which process was slowest. The run goes on: a
profile changes no step's result.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from launcher import commands
from launcher import flags, interrupts
from launcher.rundir import names, record
from launcher.rundir.asked import answers, ask, live_launcher, print_answer
from launcher.words import plural
from launcher.errors import LaunchError, Problem, SpecError
from launcher.run import profiles
from worker.contract import runfiles, sections, valuechecks


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch profile", description=commands.described("profile"))
    parser.add_argument("run_dir", metavar="RUN", help="the live run: its directory, a name "
                        "`launch runs` lists, or a job's name (its run that is running, else its newest)")
    parser.add_argument("--root", metavar="DIR", default=None, help=names.ROOT_HELP)
    parser.add_argument("--steps", type=int, metavar="N", default=None,
                        help="steps to trace (default: the job's profile.num_steps, 5 unless set)")
    parser.add_argument("--timeout-s", type=float, metavar="SECONDS", default=60.0,
                        help="how long to wait for every process's trace (default 60)")
    return parser


def _num_steps(run_dir: str, steps: int | None) -> int:
    if steps is None:
        try:
            job = json.loads(runfiles.read_regular(os.path.join(run_dir, "job.json")))
            steps = int(job["profile"]["num_steps"])  # its profile section
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            steps = sections.Profile().num_steps
    problem = valuechecks.in_range(1, 10000)(steps)
    if problem:
        raise SpecError([Problem("--steps", None, "", f"{problem}: the number of steps to trace")])
    return steps


def main(argv: list) -> int:
    """Ask, wait, print; returns the exit code.

    Raises:
      SpecError: ``--timeout-s`` is not a number of seconds > 0, ``--steps`` is not 1 to
        10000, or RUN_DIR is not a run with a live launcher on this machine (exit 2);
        nothing was asked.
      LaunchError: not every trace came within ``--timeout-s`` (exit 1).
    """
    args = parser().parse_args(argv)
    flags.check(("--timeout-s", args.timeout_s, flags.seconds, "how long to wait for every trace"))
    if args.steps is not None:  # bad input is said before the run is looked for
        _num_steps("", args.steps)
    run_dir = names.resolve(args.run_dir, args.root, names.LIVE)  # as logs, attach, wait and stop do
    num_steps = _num_steps(run_dir, args.steps)
    launcher, proven = live_launcher(run_dir, "launch profile")
    asked_at = time.time()
    request = os.path.join(run_dir, f"{profiles.REQUEST_PREFIX}{time.time_ns()}-{os.getpid()}.json")
    try:
        runfiles.write_whole(request, json.dumps({"num_steps": num_steps, "at": asked_at}))
    except OSError as exc:
        proven.close()
        raise SpecError([Problem("RUN_DIR", None, "", f"cannot write the request into {run_dir} "
                                 f"({exc.strerror}); nothing was asked")]) from None
    ask(proven, interrupts.PROFILE_REQUEST_SIGNAL)
    print(f"launch profile: asked the launcher (pid {launcher['pid']}) for "
          f"{plural(num_steps, 'step')} of every process; waiting up to {args.timeout_s:g} s",
          flush=True)
    deadline = time.monotonic() + args.timeout_s
    try:
        while time.monotonic() < deadline:
            fresh = [a for a in answers(run_dir, profiles.ANSWER_FILE) if a.get("asked_at") == asked_at]
            files = (fresh[0].get("files") or {}) if fresh else {}
            if fresh and all(os.path.exists(path) for path in files.values()):  # copied back too
                print_answer(fresh[0])
                if fresh[0].get("traced", 0) < fresh[0].get("asked", 0):
                    raise LaunchError(f"{fresh[0]['traced']} of {fresh[0]['asked']} processes traced")
                return 0
            if not record.launcher_alive(launcher):
                raise LaunchError(f"the run's launcher (pid {launcher['pid']}) ended before every "
                                  "trace came (the run is over)")
            time.sleep(0.1)
    finally:  # not taken yet (the caller gave up, or the run ended): nobody is left to ask for it
        if os.path.exists(request):
            os.remove(request)
    raise LaunchError(f"not every trace came within {args.timeout_s:g} s: the launcher (pid "
                      f"{launcher['pid']}) asks once every process has logged a step of its "
                      "attempt (a request while they start, or while a restart waits, waits for "
                      "that), one request at a time, and a process traces once it reaches the "
                      "first asked step; see the run's console, or raise --timeout-s (this "
                      "request was withdrawn if it was not taken yet)")
