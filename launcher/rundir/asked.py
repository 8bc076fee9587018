"""A live run's launcher asked for something (``launch stacks``, ``launch profile``): found
from ``run.json`` (a claim), proven to hold the run's lock (``runlock.prove``) before it is
signalled, and its answers read back from the run's logs (``stacks.json``, ``profile.json``).
"""

from __future__ import annotations

import json
import os
import socket

from launcher import owned
from launcher.errors import LaunchError, Problem, SpecError
from launcher.rundir import runlock
from launcher.rundir.record import RUN_FILE, launcher_alive, read_record
from worker.contract import runfiles


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
