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
import json
import os
import socket
import time

from launcher import commands
from launcher import flags, interrupts, owned
from launcher.rundir import names, runlock
from launcher.rundir.record import RUN_FILE, launcher_alive, read_record
from launcher.errors import LaunchError, Problem, SpecError
from launcher.run import stacks
from worker.contract import runfiles


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch stacks", description=commands.described("stacks"))
    parser.add_argument("run_dir", metavar="RUN", help="the live run: its directory, a name "
                        "`launch runs` lists, or a job's name (its newest run)")
    parser.add_argument("--root", default=None, help=names.ROOT_HELP)
    parser.add_argument("--timeout-s", type=float, default=15.0,
                        help="how long to wait for the launcher's answer (default 15)")
    return parser


def answers(run_dir: str, name: str) -> list:
    """Every answer file ``name`` under the run's logs, newest answer first (no link followed:
    a directory link planted there, even one to the run itself, is not walked)."""
    found = []
    for top, _, files in os.walk(os.path.join(run_dir, "logs")):  # followlinks=False
        if name not in files:
            continue
        try:  # a regular file only: a FIFO in its place must not hold the command
            found.append(json.loads(runfiles.read_regular(os.path.join(top, name))))
        except (OSError, ValueError, RecursionError):
            continue
    return sorted((a for a in found if isinstance(a, dict) and isinstance(a.get("at"), (int, float))),
                  key=lambda a: a["at"], reverse=True)


def print_answer(answer: dict) -> None:
    """An answer's lines, then each process's file."""
    for line in answer.get("lines") or []:
        print(line)
    files = answer.get("files") or {}
    for process_id in sorted(files, key=int):
        print(f"process {process_id}: {files[process_id]}")


def live_launcher(run_dir: str, command: str) -> tuple:
    """The live run's launcher, on this machine: run.json's ``launcher`` (pid and host: a
    claim) and the process proven to be it (``runlock.prove``), which alone is signalled.

    Returns:
      (run.json's ``launcher`` dict, ``runlock.Launcher``): close the latter when done.

    Raises:
      SpecError: RUN_DIR is not a run with a live launcher on this machine, not this user's
        own (``owned.check_dir``), or the process it names is not provably its launcher (exit 2).
    """
    owned.check_dir(run_dir, "RUN_DIR")  # another user's run is theirs: said, nothing signalled
    record = read_record(os.path.join(run_dir, RUN_FILE)) if os.path.isdir(run_dir) else None
    if record is None:
        raise SpecError([Problem("RUN_DIR", None, "", f"{run_dir} holds no run.json: give the "
                                 "directory of a run (`launch runs` lists them)")])
    launcher = record.get("launcher")
    if record.get("state") != "running" or not launcher_alive(launcher):
        raise SpecError([Problem("RUN_DIR", None, "", f"the run in {run_dir} is not running "
                                 f"(state {record.get('state')!r}, its launcher gone): {command} "
                                 "asks a live run")])
    if launcher.get("host") != socket.gethostname():
        raise SpecError([Problem("RUN_DIR", None, "", f"its launcher runs on {launcher.get('host')} "
                                 f"(pid {launcher['pid']}): run `{command}` there")])
    return launcher, runlock.prove(run_dir, launcher["pid"], command)


def ask(proven, sig: int) -> None:
    """Signal the proven launcher, then let it go.

    Raises:
      LaunchError: it ended between the proof and the signal (exit 1).
    """
    try:
        proven.send(sig)
    except ProcessLookupError:
        raise LaunchError(f"the run's launcher (pid {proven.pid}) ended before it was asked "
                          "(the run is over)") from None
    finally:
        proven.close()


def main(argv: list) -> int:
    """Ask, wait, print; returns the exit code.

    Raises:
      SpecError: ``--timeout-s`` is not a number of seconds > 0, or RUN_DIR is not a run
        with a live launcher on this machine (exit 2); nothing was asked.
      LaunchError: the launcher did not answer within ``--timeout-s`` (exit 1).
    """
    args = _parser().parse_args(argv)
    flags.check(("--timeout-s", args.timeout_s, flags.seconds, "how long to wait for the answer"))
    run_dir = names.resolve(args.run_dir, args.root)  # as logs, attach, wait and stop do
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
