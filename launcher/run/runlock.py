"""One launcher per run directory: a lock held for the life of a launch.

Two launchers writing one run directory (``--resume`` of a run whose launcher is
still going, two launches given the same ``--run-dir``) would mix checkpoints,
logs and run.json. Each launch that writes a run directory holds an exclusive
``flock(2)`` on ``RUN_DIR/LOCK_FILE`` from before its first write to its exit,
with who holds it (pid, host, user, start time, argv) written inside. The kernel
drops the lock when its process ends, however it ends (SIGKILL, a crash), so a
lock file whose lock nobody holds is stale by definition and is taken over; a
held one refuses the second launcher with the holder's details. On NFS, Linux
emulates flock with POSIX byte-range locks, which NFSv4 servers honour.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time

from launcher.errors import Problem, SpecError
from worker import redact

LOCK_FILE = "launcher.lock"


class RunLock:
    """The held lock of one run directory (``acquire``); ``release`` or process exit drops it."""

    def __init__(self, path: str, fd: int):
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays, as a record
            self._fd = None


def holder(path: str) -> dict:
    """What ``path`` (a lock file) says of its holder ({} if unreadable)."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def acquire(run_dir: str, flag: str) -> RunLock:
    """Take ``run_dir``'s lock (made with the directory if need be) or refuse.

    Args:
      run_dir: the run directory (created, mode 0700 when new).
      flag: the command-line flag that named it, for the error.

    Raises:
      SpecError: another live launcher holds it (its pid, host and start time named);
        nothing was started.
    """
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    path = os.path.join(run_dir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        who = holder(path)
        since = who.get("started")
        since_text = (time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since))
                      if isinstance(since, (int, float)) else "")
        raise SpecError([Problem(flag, None, "", (
            f"{run_dir} is in use by another launcher (pid {who.get('pid', '?')} on "
            f"{who.get('host', '?')}{since_text}: {who.get('command', '?')}); wait for it to end "
            f"or stop it (kill {who.get('pid', 'PID')}), then run again"))]) from None
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
              "command": " ".join(["launch", *redact.masked_argv(sys.argv[1:])])[:500]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return RunLock(path, fd)


def held(run_dir: str) -> bool | None:
    """Whether a live launcher holds ``run_dir``'s lock: how a later launch tells a
    stale job (its launcher gone) from a live launch of the same job beside it.

    Returns:
      True: held (a launcher is running it); False: the lock file is there and
      nobody holds it (its launcher ended, however it ended); None: no lock file
      (not a run directory of this version, or unreadable), so nothing is known.
    """
    try:
        fd = os.open(os.path.join(run_dir, LOCK_FILE), os.O_RDONLY)
    except OSError:
        return None
    try:
        # shared: conflicts with the holder's exclusive lock, and needs only a read-only
        # descriptor (NFS emulates flock with POSIX locks, whose write locks need write access)
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False
