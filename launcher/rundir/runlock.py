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
import signal
import socket
import stat
import sys
import time

from launcher import owned, proctl
from launcher.errors import Problem, SpecError
from worker.contract import redact, runfiles

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
        found = json.loads(runfiles.read_regular(path, 1 << 16))
    except (OSError, ValueError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}


def acquire(run_dir: str, flag: str, secrets=()) -> RunLock:
    """Take ``run_dir``'s lock (made with the directory if need be) or refuse.

    Args:
      run_dir: the run directory (created, mode 0700 when new).
      flag: the command-line flag that named it, for the error.
      secrets: the spec's ``secrets:`` names, masked in the command line the lock keeps (and
        a refused launch prints) with every value that looks secret (``redact.masked_argv``).

    Raises:
      SpecError: another live launcher holds it (its pid, host and start time named), it is
        not the user's own (``owned.check_dir``), or a symbolic link stands in the run directory (the lock file or any other: refused,
        never followed); nothing was started.
    """
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    owned.check_dir(run_dir, flag)  # the user's own, writable by nobody else
    links = runfiles.links_in(run_dir)
    if links:  # each file is opened without following links too; this says so before anything
        raise SpecError([Problem(flag, None, "", runfiles.refused(path).strerror)
                         for path in links])
    path = os.path.join(run_dir, LOCK_FILE)
    try:
        fd = runfiles.opener(path, os.O_RDWR | os.O_CREAT)
    except (runfiles.LinkRefused, runfiles.NotOwned) as exc:
        raise SpecError([Problem(flag, None, "", exc.strerror)]) from None
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
              "command": " ".join(["launch", *redact.masked_argv(sys.argv[1:], secrets)])[:500]}
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
        fd = runfiles.opener(os.path.join(run_dir, LOCK_FILE), os.O_RDONLY)
    except OSError:  # a link too: it proves nothing
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


class Launcher:
    """A process proven to be a run directory's launcher (``prove``); ``send`` signals it.

    Held through a pidfd where the kernel has them (Linux 5.3+): a pid reused between the
    proof and the signal is another process, which the pidfd does not reach.
    """

    def __init__(self, pid: int, pidfd: int | None):
        self.pid, self._pidfd = pid, pidfd

    def send(self, sig: int) -> None:
        """Send ``sig`` to the proven launcher.

        Raises:
          ProcessLookupError: it has ended since the proof.
        """
        if self._pidfd is None:
            os.kill(self.pid, sig)
        else:
            signal.pidfd_send_signal(self._pidfd, sig)

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def prove(run_dir: str, pid: int, command: str) -> Launcher:
    """``pid`` as ``run_dir``'s launcher, proven from what the kernel says, not what a file says:
    a process of this user that holds ``RUN_DIR/LOCK_FILE`` open while that lock is held (the
    launcher takes it before its first write and keeps it to its exit; a worker does not
    inherit it).

    Args:
      run_dir: the run directory.
      pid: the launcher's pid as the run's files name it (a claim, checked here).
      command: the command asking (``launch stacks``), for the messages.

    Raises:
      SpecError: it is not provably the launcher (gone, another user's, not holding the
        lock, or no lock held at all); nothing was signalled.
    """
    def refuse(why: str) -> SpecError:
        return SpecError([Problem("RUN_DIR", None, "", f"{why}; {command} signalled nothing")])

    path = os.path.join(run_dir, LOCK_FILE)
    try:
        lock = os.lstat(path)
    except OSError:
        lock = None
    if lock is not None and lock.st_uid != os.getuid():
        raise refuse(f"the run belongs to user {user_name(lock.st_uid)} ({path} is theirs), not to "
                     f"you ({user_name(os.getuid())}): ask it as {user_name(lock.st_uid)}")
    if lock is None or not stat.S_ISREG(lock.st_mode) or held(run_dir) is not True:
        raise refuse(f"no launcher holds {path} (the run is over, or {run_dir} is not a run "
                     "directory of this version)")
    try:
        pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    except OSError:  # ProcessLookupError: gone
        raise refuse(f"the launcher the run names (pid {pid}) is gone") from None
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
        if owner != os.getuid():
            raise refuse(f"the run's launcher (pid {pid}) belongs to user {user_name(owner)}, not to "
                         f"you ({user_name(os.getuid())}): ask it as {user_name(owner)}")
        if not holds_for_writing(pid, (lock.st_dev, lock.st_ino)):
            raise refuse(f"pid {pid} ({proctl.cmdline(pid, 80)}), named in the run's files as its "
                         f"launcher, does not hold {path}: it is not this run's launcher")
    except PermissionError:
        raise refuse(f"the process the run names (pid {pid}) is not yours to ask") from None
    except BaseException:
        if pidfd is not None:
            os.close(pidfd)
        raise
    return Launcher(pid, pidfd)


def holds_for_writing(pid: int, file_id: tuple) -> bool:
    """Whether ``pid`` has the file ``file_id`` (st_dev, st_ino) open for writing
    (``/proc/PID/fd`` and its ``fdinfo`` flags): the launcher opens its lock read-write, and a
    reader that only asks whether the lock is held (``held``, ``launch wait``) opens it
    read-only, so it is never taken for the launcher.

    Raises:
      PermissionError: its descriptors are not this user's to read.
    """
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    for name in names:
        try:
            found = os.stat(f"/proc/{pid}/fd/{name}")
            if (found.st_dev, found.st_ino) != file_id:
                continue
            with open(f"/proc/{pid}/fdinfo/{name}", encoding="ascii") as f:
                flags = next((int(line.split()[1], 8) for line in f if line.startswith("flags:")), 0)
        except (FileNotFoundError, ValueError):
            continue
        if flags & os.O_ACCMODE in (os.O_RDWR, os.O_WRONLY):
            return True
    return False


user_name = owned.user_name
