"""A run directory is input: its files are opened without following symbolic links.

Whoever can write into a run directory (a shared one, one copied from elsewhere, one another
user's program touched) can leave a symbolic link where podlaunch writes
(``run.json.partial`` -> ``~/.bashrc``) or reads (``run.json`` -> a file of someone else's).
So every file of a run directory is opened with ``O_NOFOLLOW`` (``opener``; a link in its place
is refused with ``LinkRefused``), and every file written whole goes through a temporary file
this process made itself (``O_CREAT | O_EXCL``, never one found there) renamed over the target:
``rename(2)`` replaces a link, it never writes through one. Standard library only: the launcher
and the worker share it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile


class LinkRefused(OSError):
    """A run directory's file is a symbolic link (or a link stands where one would be made)."""


class NotOwned(OSError):
    """A run directory's file belongs to another user, or others may write it: whoever can
    write it could steer what podlaunch reads from it."""


def not_owned(path: str, found: os.stat_result) -> NotOwned | None:
    """The error for a file of another owner, or writable by group or others; None if it is
    the user's own. As OpenSSH's ``StrictModes`` refuses such a key file."""
    mode = stat.S_IMODE(found.st_mode)
    if found.st_uid != os.geteuid():
        try:
            import pwd

            owner = pwd.getpwuid(found.st_uid).pw_name
        except (ImportError, KeyError):
            owner = f"uid {found.st_uid}"
        return NotOwned(errno.EPERM, f"{path} belongs to user {owner}, not to you (mode {mode:04o}); "
                        "podlaunch reads and writes only your own files in a run directory: "
                        "remove it, or use a run directory of your own", path)
    if mode & 0o022:
        return NotOwned(errno.EPERM, f"{path} is writable by others (mode {mode:04o}); podlaunch "
                        f"trusts no file others could have written: `chmod go-w {path}` if its "
                        "content is yours, else remove it", path)
    return None


def refused(path: str) -> LinkRefused:
    """The error for a link at ``path``: what was seen, why it is refused, what to do."""
    return LinkRefused(errno.ELOOP, f"{path} is a symbolic link; podlaunch follows no link in a "
                       "run directory (anyone who can write there could aim it at your files): "
                       "remove the link, then run again", path)


def opener(path: str, flags: int) -> int:
    """An ``open(..., opener=opener)`` for a run directory's files: made with mode 0600, never
    through a link, never one of another owner or that others may write.

    Raises:
      LinkRefused: ``path`` is a symbolic link.
      NotOwned: it is another user's, or writable by group or others (``not_owned``).
      OSError: it cannot be opened otherwise.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise refused(path) from None
        raise
    try:
        error = not_owned(path, os.fstat(fd))
    except OSError:
        os.close(fd)
        raise
    if error is not None:
        os.close(fd)
        raise error
    return fd


def read_regular(path: str, limit: int = 1 << 24) -> str:
    """The first ``limit`` bytes of the regular file ``path``, as text.

    Raises:
      LinkRefused: ``path`` is a symbolic link.
      OSError: it is not a regular file (a directory, a FIFO: never waited on), or cannot be read.
    """
    fd = opener(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file", path)
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def write_whole(path: str, data: str | bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` whole: a reader never sees half of it, and a link standing at
    ``path`` is replaced, not written through.

    Args:
      path: the file (its directory exists).
      data: text (written as UTF-8) or bytes.
      mode: the file's permission bits.

    Raises:
      OSError: it cannot be written (the target is then as it was, and no temporary is left).
    """
    directory, name = os.path.split(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if mode != 0o600:
                os.fchmod(f.fileno(), mode)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def links_in(run_dir: str, limit: int = 5) -> list:
    """The symbolic links in ``run_dir`` and below it (not followed), at most ``limit`` of them:
    a run directory podlaunch wrote holds none."""
    found = []
    for top, dirs, files in os.walk(run_dir):  # followlinks=False: a linked directory is listed
        for name in dirs + files:
            path = os.path.join(top, name)
            if os.path.islink(path):
                found.append(path)
                if len(found) >= limit:
                    return found
    return found


def local_tier_base(local_dir: str, run_dir: str) -> str:
    """A run's local tier (``worker.recovery.localtier``; the launcher reads it before a
    resume): ``local_dir`` (under ``run_dir`` when relative), then, when
    that is outside the run directory (``/dev/shm/NAME``, ``../NAME``: shared by other runs),
    a directory of this run's own (its run directory's name and a hash of its path: the
    same for every attempt and ``--resume``), then ``process-NNN``. Another run's copies are
    never this run's, and this run's cleanup never removes them."""
    base = local_dir if os.path.isabs(local_dir) else os.path.join(run_dir, local_dir)
    run = os.path.realpath(run_dir)
    if not os.path.realpath(base).startswith(run + os.sep):
        digest = hashlib.sha256(run.encode("utf-8", "surrogateescape")).hexdigest()[:12]
        base = os.path.join(base, f"{os.path.basename(run)}-{digest}")
    return base
