"""A run named on the command line (``launch logs|stop|wait|attach RUN``), and its supervisor.

RUN is a run directory, or a short name: ``JOB/STAMP`` or ``STAMP`` under ``runs/`` (what
``launch runs`` lists), or a job's name under ``runs/``: its newest run, as ``launch runs JOB``
lists first. Nothing in a run directory is trusted: run.json is read defensively
(``record.read_record``) and its pid is only a first guess. The supervisor is the process
that holds the run's lock (``launcher.rundir.runlock``): this user's, with the lock file open
for writing per ``/proc/PID/fd`` and ``fdinfo``; only such a process is ever signalled.
"""

from __future__ import annotations

import os
import stat

from launcher import owned, proctl
from launcher.rundir import index, runlock
from launcher.rundir.record import RUN_FILE, read, read_record
from launcher.errors import Problem, SpecError

ROOT_HELP = "where runs are (default: runs/ here, then every run you started anywhere)"
EXIT_CODES = {"succeeded": 0, "diverged": 1, "failed": 1,
              "interrupted": 130}  # as launcher.cli exits


def resolve(name: str, root: str | None = None) -> str:
    """The run directory ``name`` means (absolute), looked for under ``root``, and where that
    is not given (``--root`` left out) also among every run the user started anywhere
    (``launcher.rundir.index``), after those under ``runs/`` here.

    Raises:
      SpecError: no such run (exit 2), at once.
    """
    indexed, root = root is None, root or "runs"
    candidates = [name, os.path.join(root, name)]
    try:
        candidates += [os.path.join(root, job, name) for job in sorted(os.listdir(root))]
    except OSError:
        pass
    found = [os.path.abspath(c) for c in candidates if os.path.isdir(c) and is_run_dir(c)]
    newest = (find(root, name) if os.sep not in name and not is_run_dir(
        os.path.join(root, name)) and os.path.isdir(os.path.join(root, name)) else [])
    if found and newest and not os.path.isdir(name):  # a run and a job of that name
        raise SpecError([Problem("RUN", None, "", (
            f"{name!r} names a run ({found[0]}) and a job whose newest run is "
            f"{os.path.abspath(newest[0].run_dir)}: give the run's directory"))])
    if not found and newest:  # a job's name: its newest run
        found = [os.path.abspath(newest[0].run_dir)]
    if not found and indexed and not os.path.isabs(name):  # started from another directory
        found = _indexed(name)
    if not found:
        raise SpecError([Problem("RUN", None, "", f"no run {name!r}: give a run directory, a job's name or a "
                                 f"name `launch runs` lists (under {os.path.abspath(root)})")])
    if len(set(found)) > 1 and not os.path.isdir(name):
        raise SpecError([Problem("RUN", None, "", f"{name!r} names several runs ("
                                 + ", ".join(sorted(set(found))) + "): give its directory")])
    owned.check_dir(found[0])  # another user's run is theirs: said, nothing read or signalled
    return found[0]


def _indexed(name: str) -> list:
    """The user's runs from anywhere (``launcher.rundir.index``) that ``name`` means: the one whose
    directory ends in ``name`` (``STAMP``, ``JOB/STAMP``), else a job's newest run."""

    known = index.runs()
    ending = [d for d in known if d.endswith(os.sep + name.strip(os.sep))]
    if ending:
        return ending[-1:]
    of_job = sorted((read(d) for d in known), key=lambda r: (r.started, r.run_dir))
    return [r.run_dir for r in of_job if r.job == name][-1:]


def state(run_dir: str) -> tuple:
    """``(state, alive)``: run.json's state ("running", "succeeded", ...; "" when none yet)
    and whether a supervisor holds the run now."""
    record = read_record(os.path.join(run_dir, RUN_FILE)) or {}
    value = record.get("state")
    return (value if isinstance(value, str) else ""), runlock.held(run_dir) is True


def _holds_lock(pid: int, lock: os.stat_result) -> bool:
    """Whether ``pid`` is this user's and has the lock file open for writing
    (``runlock.holds_for_writing``: a reader such as ``launch wait`` is never taken for the
    supervisor)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
        return runlock.holds_for_writing(pid, (lock.st_dev, lock.st_ino))
    except OSError:  # gone, or not this user's to read
        return False


def supervisor(run_dir: str) -> int | None:
    """The pid of the run's live supervisor on this machine, proven as the module says, or None."""
    try:  # a regular file of the run's own, not a link planted to point elsewhere
        lock = os.lstat(os.path.join(run_dir, runlock.LOCK_FILE))
    except OSError:
        return None
    if not stat.S_ISREG(lock.st_mode) or runlock.held(run_dir) is not True:
        return None
    record = read_record(os.path.join(run_dir, RUN_FILE)) or {}
    guess = (record.get("launcher") or {}).get("pid") if isinstance(record.get("launcher"), dict) else None
    others = [p for p in proctl.pids() if p not in (guess, os.getpid())]
    for pid in ([guess] if isinstance(guess, int) and guess > 0 else []) + others:
        if _holds_lock(pid, lock):
            return pid
    return None


def final_code(run_dir: str, name: str) -> int:
    """The exit code of a run that is not held by a supervisor any more: its own (run.json),
    or 1, said, when its supervisor ended without writing one (killed)."""
    value, _ = state(run_dir)
    if value in EXIT_CODES:
        return EXIT_CODES[value]
    print(f"launch: the run {name} did not end by itself: its supervisor is gone (killed, or its "
          f"machine went away) while its state says running; {after_supervisor(run_dir, name)}")
    return 1


def after_supervisor(run_dir: str, name: str) -> str:
    """What to do about a run whose supervisor is gone: a detached run (it kept a journal)
    is taken back by ``launch attach``; a run started in the foreground ended with its
    launcher, and ``--resume`` continues it."""
    from launcher.rundir.journal import JOURNAL_FILE

    if os.path.exists(os.path.join(run_dir, JOURNAL_FILE)):
        return f"its processes may go on: `launch attach {name}` takes them back"
    return ("it was started without --detach, so its processes ended with its launcher: "
            f"`launch JOB.yaml --resume {name}` continues it from its last checkpoint")


def is_run_dir(path: str) -> bool:
    """Whether ``path`` holds a run (what ``launch`` writes before any worker starts)."""
    return os.path.isfile(os.path.join(path, "spec.yaml")) or os.path.isfile(os.path.join(path, RUN_FILE))


def find(root: str = "runs", job: str | None = None, indexed: bool = False) -> list:
    """Every run under ``root`` (``root/<job>/<run>``), and with ``indexed`` every run the user's
    index knows (``launcher.rundir.index``: started from any directory), of ``job`` only if given,
    each once, newest first."""
    found = _find_under(root, job)
    if indexed:
        known = index.runs()
        listed = {os.path.realpath(d) for d in known}
        for past in found:  # a lost index gets back what is found where it was looked for
            if os.path.realpath(past.run_dir) not in listed:
                index.add(past.run_dir)
        seen = {os.path.realpath(r.run_dir) for r in found}
        for run_dir in known:
            if os.path.realpath(run_dir) not in seen:
                seen.add(os.path.realpath(run_dir))
                past = read(run_dir)
                if job is None or past.job == job:
                    found.append(past)
    return sorted(found, key=lambda r: (r.started, r.run_dir), reverse=True)


def _find_under(root: str, job: str | None) -> list:
    found = []
    try:
        jobs = [job] if job is not None else sorted(os.listdir(root))
    except OSError:
        return []
    for name in jobs:
        try:
            entries = os.listdir(os.path.join(root, name))
        except OSError:
            continue
        for entry in entries:
            path = os.path.join(root, name, entry)
            if os.path.isdir(path) and is_run_dir(path):
                found.append(read(path))
    return found
