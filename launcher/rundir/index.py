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
    """Record ``run_dir`` (its real path) as one of the user's runs; a folder that cannot be
    made or written is never an error (the run is found under its root as before).

    Raises:
      SpecError: the podlaunch folder or the index is not the user's own (a link, another
        user's, open to others, a FIFO or a device: ``owned.state_folder``,
        ``owned.open_state_file``); nothing was written there.
    """
    line = os.path.realpath(run_dir)
    if "\n" in line or owned.state_folder(create=True, flag="launch") is None:
        return
    try:
        fd = owned.open_state_file(path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, flag="launch")
        try:
            os.write(fd, (line + "\n").encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
    except OSError:
        pass


def runs() -> list:
    """The indexed run directories that still hold a run of this user's, each once, newest
    entry last; the index is rewritten without the others when it has grown past ``KEEP``.

    Raises:
      SpecError: the podlaunch folder or the index is not the user's own (as ``add``).
    """
    if owned.state_folder(flag="RUN") is None:
        return []
    try:
        with os.fdopen(owned.open_state_file(path(), os.O_RDONLY, flag="RUN"), "rb") as f:
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
