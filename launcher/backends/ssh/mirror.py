"""A copy of process 0's checkpoints on the launching machine, put back on a host 0 that lacks them."""

from __future__ import annotations

import os
import shutil
import threading

import paramiko

from launcher.backends.ssh.connection import Host
from launcher.backends.ssh.transfer import get_file, mkdirs
from launcher.console import NullConsole
from worker import contract
from worker.contract import wire


class CheckpointMirror:
    """Keeps process 0's checkpoints in the local run directory too, and puts them back.

    Process 0 writes checkpoints on host 0 (``worker.recovery.checkpoint``: complete
    ``step-NNNNNNN`` directories appear by rename). ``sync`` copies every one
    the local ``<run dir>/checkpoints`` lacks (among host 0's newest
    ``checkpoint.keep``) into a hidden temporary directory, then renames it into
    place, and drops local ones beyond the newest ``keep``; the worker
    triggers it with each ``wire.CheckpointSaved`` line and at the end.
    ``push`` (before a resumed or restarted attempt starts) uploads the local
    checkpoints host 0 lacks, the same way: so a run survives losing host 0
    (a preempted VM replaced by a new one, a wiped disk).

    Copies run on their own SFTP channel, one at a time (a lock), in the
    background while training goes on; a failed copy is reported once and
    retried at the next checkpoint.

    Args:
      host: host 0 (its connection carries the copies).
      local_run_dir: the run directory on this machine.
      remote_run_dir: process 0's run directory on host 0 (its placement's).
      keep: ``checkpoint.keep``.
    """

    def __init__(self, host: Host, local_run_dir: str, remote_run_dir: str, keep: int,
                 console=None):
        self.host = host
        self.console = console if console is not None else NullConsole()
        self.local = os.path.join(local_run_dir, contract.CHECKPOINTS_DIR)
        self.remote = f"{remote_run_dir}/{contract.CHECKPOINTS_DIR}"
        self.keep = keep
        self._lock = threading.Lock()
        self._sftp: paramiko.SFTPClient | None = None
        self._warned = False

    def _local_names(self) -> list:
        names = os.listdir(self.local) if os.path.isdir(self.local) else []
        return [name for _, name in contract.checkpoints_in(names)]

    def _channel(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = paramiko.SFTPClient.from_transport(self.host.connection.transport)
        return self._sftp

    def on_line(self, line: str) -> None:
        """Start a background ``sync`` when ``line`` says a checkpoint was saved."""
        if isinstance(wire.parse(line), wire.CheckpointSaved):
            threading.Thread(target=self.sync, name="checkpoint-mirror", daemon=True).start()

    def sync(self) -> list:
        """Copy host 0's newest checkpoints that are not here yet. Returns the names copied."""
        copied = []
        with self._lock:
            try:
                sftp = self._channel()
                try:
                    names = [name for _, name in contract.checkpoints_in(sftp.listdir(self.remote))]
                except FileNotFoundError:
                    return copied
                for name in names[-self.keep:]:
                    if not os.path.exists(os.path.join(self.local, name)):
                        self._get(sftp, name)
                        copied.append(name)
                for name in self._local_names()[:-self.keep]:
                    shutil.rmtree(os.path.join(self.local, name), ignore_errors=True)
            except Exception as exc:  # noqa: BLE001 - the run goes on; say it once
                self._sftp = None
                if not self._warned:
                    self._warned = True
                    self.console.say(f"could not copy a checkpoint from {self.host.name} into "
                                     f"{self.local}: {exc} (retried at the next checkpoint)")
        return copied

    def _get(self, sftp: paramiko.SFTPClient, name: str) -> None:
        tmp = os.path.join(self.local, f".tmp-copy-{name}")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        try:
            for entry in sftp.listdir(f"{self.remote}/{name}"):
                get_file(sftp, f"{self.remote}/{name}/{entry}", os.path.join(tmp, entry))
        except BaseException:  # host 0 pruned it meanwhile, or the connection went: no half copy left
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        os.rename(tmp, os.path.join(self.local, name))

    def push(self, sftp: paramiko.SFTPClient) -> list:
        """Upload the local checkpoints host 0 lacks. Returns the names uploaded.

        Raises:
          OSError: the upload failed (the attempt must not start without them).
        """
        local = self._local_names()
        if not local:
            return []
        try:
            there = set(sftp.listdir(self.remote))
        except FileNotFoundError:
            mkdirs(sftp, self.remote)
            there = set()
        pushed = []
        for name in local[-self.keep:]:
            if name in there:
                continue
            tmp = f"{self.remote}/.tmp-push-{name}"
            mkdirs(sftp, tmp)
            for entry in os.listdir(os.path.join(self.local, name)):
                sftp.put(os.path.join(self.local, name, entry), f"{tmp}/{entry}")
            sftp.posix_rename(tmp, f"{self.remote}/{name}")
            pushed.append(name)
        return pushed
