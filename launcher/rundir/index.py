"""The user's index of runs: where every run this user started is, so that ``launch runs`` and
every run command (``logs``, ``attach``, ``wait``, ``stop``, ``stacks``, ``profile``) find a
run started from any directory, as ``squeue`` and ``sky status`` answer from anywhere.

Pointers only: ``$XDG_STATE_HOME/podlaunch/runs.index`` (``launcher.owned.state_dir``; 0600),
one run directory's absolute path a line, appended when a launch creates the run. The runs
themselves stay the truth: an entry whose directory is gone, or is no run, is skipped (and
dropped at the next rewrite); a lost index loses no run (those under ``./runs`` are found
as before, and added back when listed). Standard library only.
"""

from __future__ import annotations

import os

from launcher import owned

INDEX_FILE = "runs.index"
KEEP = 2000  # entries kept when the index is rewritten (the newest)


def path() -> str:
    """Where the index is: ``$XDG_STATE_HOME/podlaunch/runs.index``."""
    return os.path.join(owned.state_dir(), INDEX_FILE)


def add(run_dir: str) -> None:
    """Record ``run_dir`` (absolute) as one of the user's runs; a failure to is never an error
    (the run is found under its root as before)."""
    line = os.path.abspath(run_dir)
    if "\n" in line:
        return
    try:
        os.makedirs(owned.state_dir(), mode=0o700, exist_ok=True)
        fd = os.open(path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, (line + "\n").encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
    except OSError:
        pass


def runs() -> list:
    """The indexed run directories that still hold a run of this user's, each once, newest
    entry last; the index is rewritten without the others when it has grown past ``KEEP``."""
    try:
        fd = os.open(path(), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            found = os.fstat(f.fileno())
            if owned.not_own(found) is not None:  # not the user's own: nothing in it is used
                return []
            lines = f.read(1 << 24).decode("utf-8", "surrogateescape").splitlines()
    except OSError:
        return []
    seen, kept = set(), []
    for line in reversed(lines):
        if not os.path.isabs(line) or line in seen:
            continue
        seen.add(line)
        if _holds_run(line):
            kept.append(line)
    kept.reverse()
    if len(lines) > KEEP:
        _rewrite(kept[-KEEP:])
    return kept


def _holds_run(path: str) -> bool:
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return (found.st_uid == os.geteuid() and os.path.isdir(path)
            and any(os.path.isfile(os.path.join(path, name)) for name in ("spec.yaml", "run.json")))


def _rewrite(entries: list) -> None:
    from worker.contract import runfiles

    try:
        runfiles.write_whole(path(), "".join(e + "\n" for e in entries))
    except OSError:
        pass
