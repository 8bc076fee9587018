"""A run named on the command line (``launch logs|stop|wait|attach RUN``), and its supervisor.

RUN is a run directory, or a short name: ``JOB/STAMP`` or ``STAMP`` under ``runs/`` (what
``launch runs`` lists), or a job's name: its newest run, its live one for ``stop``, ``attach``
and ``wait``, its newest failed one for ``why`` (``resolve``: one resolver for every command,
``launch tensorboard`` included). Nothing in a run directory is trusted: run.json is read defensively
(``record.read_record``) and its pid is only a first guess. The supervisor is the process
that holds the run's lock (``launcher.rundir.runlock``): this user's, with the lock file open
for writing per ``/proc/PID/fd`` and ``fdinfo``; only such a process is ever signalled.
"""

from __future__ import annotations

import os
import shlex
import stat

from launcher import owned, proctl
from launcher.words import plural
from launcher.rundir import index, runlock
from launcher.rundir.record import RUN_FILE, read, read_record
from launcher.errors import Problem, SpecError

ROOT_HELP = "where runs are (default: runs/ here, then every run you started anywhere)"
EXIT_CODES = {"succeeded": 0, "diverged": 1, "failed": 1,
              "interrupted": 130}  # as launcher.cli exits


NEWEST, LIVE, FAILED = "newest", "live", "failed"  # which run of a job its name means


def resolve(name: str, root: str | None = None, prefer: str = NEWEST) -> str:
    """The run directory ``name`` means (absolute): the one every run command, ``launch
    tensorboard`` included, finds for the same name.

    ``name`` is a run directory, a short name (``JOB/STAMP`` or ``STAMP``: what ``launch runs``
    lists) or a job's name, looked for under ``root``, and where that is not given (``--root``
    left out) also among every run the user started anywhere (``launcher.rundir.index``).
    None (no name given: ``launch why``, ``launch logs``) means one of every run there, as a
    job's name means one of its runs, by ``prefer``: ``NEWEST``; ``LIVE`` (``stop``,
    ``attach``, ``wait``) its run that is running, where there is one (several: refused,
    each listed), else its newest; ``FAILED`` (``why``) its newest run that failed, else its
    newest that had a failed attempt, else its newest.

    Raises:
      SpecError: no such run (with the closest names, and where it looked), a name that means
        several, or another user's run (exit 2), at once.
    """
    indexed, base = root is None, root or "runs"
    if name is None:  # no name given: every run, as a job's name means its own (``prefer``)
        runs = find(base, None, indexed=indexed)
        if not runs:
            raise SpecError([Problem("RUN", None, "", f"no runs {looked_in(root)}; start one "
                                     "with `launch JOB.yaml`, or give a run directory")])
        chosen = os.path.abspath(_chosen("", runs, prefer).run_dir)
        owned.check_dir(chosen)
        return owned.real_path(chosen)
    found = _runs_named(name, base, indexed)
    of_job = find(base, name, indexed=indexed) if name and os.sep not in name else []
    if found and of_job and not (os.path.isdir(name) and is_run_dir(name)):  # a run and a job
        raise SpecError([Problem("RUN", None, "", (
            f"{name!r} names a run ({found[0]}) and a job whose newest run is "
            f"{os.path.abspath(of_job[0].run_dir)}: give the run's directory"))])
    if not found and of_job:
        found = [os.path.abspath(_chosen(name, of_job, prefer).run_dir)]
    if not found:
        raise SpecError([Problem("RUN", None, "", f"no run or job {name!r} {looked_in(root)}"
                                 + _closest(name, base, indexed) + "; give a run directory, a "
                                 "job's name or a name `launch runs` lists")])
    if len(found) > 1:
        raise SpecError([Problem("RUN", None, "", f"{name!r} names several runs ("
                                 + ", ".join(sorted(found)) + "): give its directory")])
    owned.check_dir(found[0])  # another user's run is theirs: said, nothing read or signalled
    return owned.real_path(found[0])  # one run, one path (a linked folder above it resolved)


def looked_in(root: str | None) -> str:
    """Where a name was looked for, in words: ``root``, or ``runs/`` here and the index."""
    if root is not None:
        return f"under {os.path.abspath(root)}"
    return f"under {os.path.abspath('runs')} or in your index of runs ({index.path()})"


def _runs_named(name: str, base: str, indexed: bool) -> list:
    """The run directories (absolute, each once) that ``name`` names as a run: a path, or a
    short name under ``base`` and, ``indexed``, among the user's runs from anywhere (the one
    whose directory ends in ``name``: ``STAMP``, ``JOB/STAMP``)."""
    if os.path.isdir(name) and is_run_dir(name):
        return [os.path.abspath(name)]
    candidates = [os.path.join(base, name)]
    try:
        candidates += [os.path.join(base, job, name) for job in sorted(os.listdir(base))]
    except OSError:
        pass
    found = [os.path.abspath(c) for c in candidates if os.path.isdir(c) and is_run_dir(c)]
    if not found and indexed and name.strip(os.sep) and not os.path.isabs(name):
        found = [d for d in index.runs() if d.endswith(os.sep + name.strip(os.sep))][-1:]
    unique: dict = {}
    for path in found:
        unique.setdefault(os.path.realpath(path), path)
    return list(unique.values())


def _chosen(job: str, runs: list, prefer: str):
    """The run of ``job`` its name means (``runs``: its runs, newest first; see ``resolve``).

    Raises:
      SpecError: ``LIVE`` with several of its runs running, each listed.
    """
    if prefer == LIVE:
        live = [r for r in runs if r.state == "running"]
        if len(live) > 1:
            raise SpecError([Problem("RUN", None, "", (
                f"job {job!r} has {plural(len(live), 'run')} running: "
                + ", ".join(short(r.run_dir) for r in live)
                + "; name one of them (or its directory)"))])
        if live:
            return live[0]
    if prefer == FAILED:
        failed = ([r for r in runs if r.state in ("failed", "diverged")]
                  or [r for r in runs if r.failures])
        if failed:
            return failed[0]
    return runs[0]


def short(run_dir: str) -> str:
    """A run as run commands take it: ``JOB/STAMP``, its directory's last two parts."""
    return os.path.join(os.path.basename(os.path.dirname(run_dir)), os.path.basename(run_dir))


def _closest(name: str, base: str, indexed: bool) -> str:
    """``; did you mean ...?`` with the job and run names closest to ``name``, or ""."""
    import difflib  # only for a name that names nothing

    known = find(base, indexed=indexed)
    words = sorted({r.job for r in known} | {short(r.run_dir) for r in known}
                   | {os.path.basename(r.run_dir) for r in known})
    close = difflib.get_close_matches(name, words, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


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
    """What to do about a run whose supervisor is gone, as a command that works from any
    directory: a detached run (it kept a journal) is taken back by ``launch attach``; a run
    started in the foreground ended with its launcher, and ``launch resume`` continues it."""
    from launcher.rundir.journal import JOURNAL_FILE

    if os.path.exists(os.path.join(run_dir, JOURNAL_FILE)):
        return f"its processes may go on: `launch attach {shlex.quote(run_dir)}` takes them back"
    return ("it was started without --detach, so its processes ended with its launcher: "
            f"`launch resume {shlex.quote(run_dir)}` continues it from its newest checkpoint")


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
