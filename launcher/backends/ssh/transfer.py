"""Files to and from hosts over SFTP: directories made, files written whole, process 0's
results fetched. A synced directory is ``launcher.backends.ssh.syncdir``'s; the job file goes
in each worker's script (``hostscript.file_lines``)."""

from __future__ import annotations

import os
import stat

import paramiko

from worker.contract import runfiles


def mkdirs(sftp: paramiko.SFTPClient, path: str, mode: int = 0o700) -> None:
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
            sftp.mkdir(p, mode)
        except OSError:
            try:
                if stat.S_ISDIR(sftp.stat(p).st_mode):
                    continue  # made by another host meanwhile
            except OSError:
                pass
            raise


def new_file(sftp: paramiko.SFTPClient, path: str):
    """``path`` on the host opened for writing as a file made now (SFTP's EXCL flag): a
    leftover or a link planted there is removed first, never written through.

    Raises:
      OSError: it cannot be made (another writer made it meanwhile).
    """
    try:
        sftp.remove(path)
    except FileNotFoundError:
        pass
    return sftp.open(path, "wxb")  # w: writable; x: EXCL (with CREAT: never through a link)


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
            get_file(sftp, f"{remote}/{a.filename}", os.path.join(local, a.filename))
            count += 1
    return count


def get_file(sftp: paramiko.SFTPClient, remote: str, local: str) -> None:
    """Copy the remote file ``remote`` to ``local``, never through a link standing there (a
    run directory is input: ``worker.contract.runfiles``).

    Raises:
      OSError: it cannot be read or written (``runfiles.LinkRefused``: ``local`` is a link).
    """
    with open(local, "wb", opener=runfiles.opener) as f:
        sftp.getfo(remote, f)


def fetch_results(sftp: paramiko.SFTPClient, remote_run_dir: str, local_run_dir: str) -> int:
    """Bring process 0's ``tensorboard/`` and ``params.npz`` into the local run directory.

    Returns:
      The number of files copied.
    """
    count = get_tree(sftp, f"{remote_run_dir}/tensorboard", os.path.join(local_run_dir, "tensorboard"))
    try:
        get_file(sftp, f"{remote_run_dir}/params.npz", os.path.join(local_run_dir, "params.npz"))
        count += 1
    except OSError:
        pass
    return count
