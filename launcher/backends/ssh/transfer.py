"""Files to and from hosts over SFTP: the job, a synced directory, process 0's results."""

from __future__ import annotations

import hashlib
import os
import stat

import paramiko

SYNC_SKIP = {".git", "__pycache__", ".venv", "runs", ".podlaunch", ".pytest_cache"}


def put_if_changed(sftp: paramiko.SFTPClient, local: str, remote: str, writer: str) -> bool:
    """Copy ``local`` to ``remote`` unless the remote has the same bytes; True if copied.

    ``writer`` makes the temporary name unique: hosts that share a home
    directory (NFS) upload the same file at once, and must not rename each
    other's half-written temporary away.
    """
    with open(local, "rb") as f:
        data = f.read()
    try:
        with sftp.open(remote, "rb") as f:
            if hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest():
                return False
    except OSError:
        pass
    temporary = f"{remote}.{writer}.tmp"
    with sftp.open(temporary, "wb") as f:
        f.write(data)
    sftp.posix_rename(temporary, remote)
    return True


def mkdirs(sftp: paramiko.SFTPClient, path: str) -> None:
    """``mkdir -p`` over SFTP, safe when hosts that share the directory (an NFS home) run it
    at once: a mkdir that fails because another host just made the directory is fine
    (SFTP reports that only as a generic "Failure", so the directory is looked at again)."""
    missing = []
    while path not in ("", "/"):
        try:
            sftp.stat(path)
            break
        except OSError:
            missing.append(path)
            path = os.path.dirname(path)
    for p in reversed(missing):
        try:
            sftp.mkdir(p)
        except OSError:
            try:
                if stat.S_ISDIR(sftp.stat(p).st_mode):
                    continue  # made by another host meanwhile
            except OSError:
                pass
            raise


def sync_dir(sftp: paramiko.SFTPClient, local_dir: str, remote_dir: str) -> int:
    """Mirror ``local_dir`` into ``remote_dir``: files whose size or mtime differ are copied.

    Skips ``SYNC_SKIP`` names and symlinks; never deletes remote files.

    Returns:
      The number of files copied (0 when nothing changed).
    """
    copied = 0
    mkdirs(sftp, remote_dir)
    remote = {a.filename: a for a in sftp.listdir_attr(remote_dir)}
    for entry in sorted(os.scandir(local_dir), key=lambda e: e.name):
        if entry.name in SYNC_SKIP or entry.is_symlink():
            continue
        target = f"{remote_dir}/{entry.name}"
        if entry.is_dir():
            copied += sync_dir(sftp, entry.path, target)
            continue
        st = entry.stat()
        have = remote.get(entry.name)
        if have is not None and have.st_size == st.st_size and have.st_mtime == int(st.st_mtime):
            continue
        sftp.put(entry.path, target)
        sftp.utime(target, (int(st.st_atime), int(st.st_mtime)))
        sftp.chmod(target, stat.S_IMODE(st.st_mode))
        copied += 1
    return copied


def get_tree(sftp: paramiko.SFTPClient, remote: str, local: str) -> int:
    """Copy the remote directory ``remote`` into ``local``; returns files copied (0 if absent)."""
    try:
        attrs = sftp.listdir_attr(remote)
    except OSError:
        return 0
    os.makedirs(local, exist_ok=True)
    count = 0
    for a in attrs:
        if stat.S_ISDIR(a.st_mode):
            count += get_tree(sftp, f"{remote}/{a.filename}", os.path.join(local, a.filename))
        else:
            sftp.get(f"{remote}/{a.filename}", os.path.join(local, a.filename))
            count += 1
    return count


def fetch_results(sftp: paramiko.SFTPClient, remote_run_dir: str, local_run_dir: str) -> int:
    """Bring process 0's ``tensorboard/`` and ``params.npz`` into the local run directory.

    Returns:
      The number of files copied.
    """
    count = get_tree(sftp, f"{remote_run_dir}/tensorboard", os.path.join(local_run_dir, "tensorboard"))
    try:
        sftp.get(f"{remote_run_dir}/params.npz", os.path.join(local_run_dir, "params.npz"))
        count += 1
    except OSError:
        pass
    return count
