"""The local tier: every process keeps its newest state in fast local storage.

Process 0's persistent checkpoints (``worker.recovery.checkpoint``, every ``checkpoint.every_steps``)
are rare because each is a synchronous save. After Orbax's emergency checkpointing and
MaxText's multi-tier checkpointing, every host also keeps the newest state in its
``checkpoint.local_dir`` every ``checkpoint.local_every_steps`` (written by one process per
host: ``writes_copies``) (relative: under its run
directory; a RAM disk such as ``/dev/shm/NAME`` where the host has one): on the step's path
only a copy on the devices, dispatched like a step; the copy off the devices and the write
on a thread, in the persistent checkpoints' format (atomic rename, sha256), the newest
``KEEP`` kept. In a data-parallel job every
process holds the whole state, so any process's copy can restore every process: a restart
resumes from the newest step that process 0's checkpoints or any process's local copy
hold (``worker.recovery.broadcast.restore_broadcast``), which also covers a host 0 that came back
with an empty disk.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from typing import Callable

from worker.contract.runfiles import local_tier_base as base_directory
from worker.recovery import checkpoint

KEEP = 2  # the newest two: one may be being written when the process dies
# Copies are taken no closer together than this, whatever local_every_steps says: a restart
# loses at most this much more work, and a fast step no longer pays for a copy every call (the
# 256 x 4 job at 100 steps a call copied 1,500 times a second: 155,748 steps/s against
# 241,807 with the tier off on a TPU v5e, 304,521 against 727,410 on this project's CPU; 20
# copies a second, 0.05 s apart, still cost it 193,050 against 221,500: a copy takes about 2 ms
# of the host's CPU, on both threads)
MIN_INTERVAL_S = 0.25
PROCESS_DIR = "process-{process_id:03d}"


def directory(local_dir: str, run_dir: str, process_id: int) -> str:
    """This process's directory of local copies: ``base_directory``, then ``process-NNN``."""
    return os.path.join(base_directory(local_dir, run_dir), PROCESS_DIR.format(process_id=process_id))


ELECTION_PREFIX = "podlaunch/localtier/"
ELECTION_TIMEOUT_S = 120.0


def writes_copies(client, process_id: int, num_processes: int, base: str, attempt: int) -> bool:
    """Whether this process writes the local copies of its host: the lowest ``process_id``
    of those whose ``base`` is the same directory (host name, device and inode: processes
    of one host, or of hosts that share the filesystem). Every process holds the whole
    state, so one copy per directory is enough, and a host of 8 processes keeps one copy of
    the state on its RAM disk, not 8. Agreed over the coordination service's key-value
    store (one value each, a barrier, one directory read); every process must call it.

    Args:
      client: JAX's coordination client, or None (a single process: it writes).
      base: ``base_directory`` (made here when missing).
      attempt: the attempt (its keys and barrier are its own).

    Raises:
      OSError: ``base`` cannot be made.
    """
    import socket

    error = None
    try:
        os.makedirs(base, exist_ok=True)
        facts = os.stat(base)
        where = f"{socket.gethostname()}:{facts.st_dev}:{facts.st_ino}"
    except OSError as exc:  # said by the caller, once the others need not wait for it
        error, where = exc, f"unusable:{process_id}"
    if client is not None and num_processes > 1:
        prefix = f"{ELECTION_PREFIX}{attempt}/"
        client.key_value_set(f"{prefix}{process_id}", where)
        client.wait_at_barrier(f"podlaunch_localtier_{attempt}", int(ELECTION_TIMEOUT_S * 1000))
        same = [int(key.rsplit("/", 1)[-1]) for key, value in client.key_value_dir_get(prefix)
                if value == where]
    else:
        same = [process_id]
    if error is not None:
        raise error
    return process_id == min(same, default=process_id)


class LocalTier:
    """Writes this process's local copies (see the module's docstring).

    Args:
      path: this process's directory (``directory``).
      every_steps: a copy at the first call boundary at or after each multiple (> 0) that is
        at least ``MIN_INTERVAL_S`` after the previous copy was taken.
      num_batches, order: the data position's facts (``worker.recovery.checkpoint.Checkpoint``).
      unreplicate: a pytree of replicated leaves -> the same of numpy arrays (the parallelism's).
      warn: where a failed write is said, once.
      clock: seconds, monotonic (the interval between copies).
    """

    def __init__(self, path: str, every_steps: int, num_batches: int, order: dict | None,
                 unreplicate: Callable, warn: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.monotonic):
        self.path, self.every_steps = path, every_steps
        self.num_batches, self.order, self.unreplicate, self.warn = num_batches, order, unreplicate, warn
        self.last_step = 0
        self.clock = clock
        self._taken_at = -float("inf")  # clock() when the last copy was taken
        # One writer thread for the attempt, started at the first copy and handed each copy
        # (a thread started per copy cost the step's path its start-up handshake: about 5%
        # of a 1-device CPU run's loop at a copy every 100 steps)
        self._thread: threading.Thread | None = None
        self._wake = threading.Condition()
        self._pending: tuple | None = None  # (step, copies) handed to the writer
        self._busy = False                  # a copy handed over and not written yet
        self._closing = False
        self._failed = False
        self._warning = ""  # the writer thread's, said by after_step

    @property
    def writing(self) -> bool:
        """A copy has been handed to the writer thread and is not written yet."""
        return self._busy

    def due(self, step: int) -> bool:
        """Whether ``after_step`` has anything to do at ``step``: a line to say or a new
        interval's copy to consider (the loop skips the call, and the state's trees, otherwise)."""
        return bool(self._warning) or (
            step // self.every_steps > self.last_step // self.every_steps and not self._failed
            and self.clock() - self._taken_at >= MIN_INTERVAL_S)

    def after_step(self, step: int, params, opt_state) -> None:
        """Take a copy when ``step`` is the first call boundary of a new interval (and say
        here, on the loop's thread, what the writer thread could not write: a line printed
        from that thread could land inside one of the loop's)."""
        if self._warning:
            self.warn(self._warning)
            self._warning = ""
        if step // self.every_steps <= self.last_step // self.every_steps or self._failed:
            return
        now = self.clock()
        if now - self._taken_at < MIN_INTERVAL_S:
            return  # this interval's copy waits for a later call boundary
        self.last_step = step
        if self._busy:
            return  # the previous copy is still being written: this interval has that one
        self._taken_at = now
        import jax
        import jax.numpy as jnp

        # On the step's path only a copy on the devices, dispatched like a step (the step
        # donates its inputs, so the next step would take these buffers); the thread waits
        # for it, copies it off the devices and writes it.
        copies = jax.tree.map(jnp.copy, (params, opt_state))
        with self._wake:
            self._busy, self._pending = True, (step, copies)
            self._wake.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, daemon=True, name="local-tier")
            self._thread.start()

    def _serve(self) -> None:
        """The writer thread: writes each copy handed to it, until ``close``."""
        while True:
            with self._wake:
                while self._pending is None and not self._closing:
                    self._wake.wait()
                if self._pending is None:
                    return
                (step, copies), self._pending = self._pending, None
            try:
                self._write(step, copies)
            except Exception as exc:  # noqa: BLE001 - said on the loop's thread; no more copies
                self._failed = True
                self._warning = (f"warning: the local tier's copy of step {step} failed "
                                 f"({type(exc).__name__}: {exc}); no more local copies this attempt")
            finally:
                del copies
                self._busy = False

    def _write(self, step: int, copies) -> None:
        import jax

        try:
            leaves = jax.tree_util.tree_leaves(self.unreplicate(copies))
            del copies
            ckpt = checkpoint.Checkpoint(step=step, leaves=leaves, next_batch=step % self.num_batches,
                                         num_batches=self.num_batches, order=self.order)
            checkpoint.save(self.path, ckpt, KEEP)
        except OSError as exc:
            self._failed = True
            self._warning = (f"warning: the local tier cannot write {exc.filename or self.path} "
                             f"({exc.strerror or exc}); no more local copies this attempt")

    def close(self, wait_s: float = 30.0) -> None:
        """Let a write in progress (or handed over) finish (a restart may need it), up to
        ``wait_s``; the writer thread then ends."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(wait_s)


def remove_all(base: str) -> None:
    """At the run's end, by its host's writer: every ``process-NNN`` directory of the run in
    ``base`` (``base_directory``), earlier layouts' too (a shrink or a spare moves process
    ids, and a process of the last layout may have read another's copy), then ``base`` when
    that leaves it empty. Nothing is left in a RAM disk; another run's directory is never in
    ``base``."""
    try:
        names = [n for n in os.listdir(base) if n.startswith("process-")]
    except OSError:
        return
    for name in names:
        shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    try:
        os.rmdir(base)
    except OSError:  # not empty: the user's own files, or another host's writer is at it
        pass


def newest_here(local_dir: str, run_dir: str, process_id: int, template: list,
                num_batches: int, order: dict | None,
                warn: Callable[[str], None] = print) -> checkpoint.Checkpoint | None:
    """The newest verified local copy this process can read: its own directory's, or any
    other ``process-NNN`` directory's beside it (the copies its host's writer made, or an
    earlier layout's, before a shrink or a spare moved the process ids), or None."""
    base = base_directory(local_dir, run_dir)
    own = directory(local_dir, run_dir, process_id)
    try:
        others = sorted(os.path.join(base, n) for n in os.listdir(base) if n.startswith("process-"))
    except OSError:
        others = []
    best = None
    for path in [own] + [p for p in others if p != own]:
        if not os.path.isdir(path):
            continue
        found = newest(path, template, num_batches, order, warn)
        if found is not None and (best is None or found.step > best.step):
            best = found
    return best


def newest(path: str, template: list, num_batches: int, order: dict | None,
           warn: Callable[[str], None] = print) -> checkpoint.Checkpoint | None:
    """This process's newest local copy that verifies and fits the job, or None.

    A copy that is corrupt or does not fit (another job wrote it) is skipped with a warning,
    never an error: the local tier is a cache of the persistent checkpoints.
    """
    try:
        return checkpoint.latest(path, template, num_batches, warn, order)
    except checkpoint.NoUsableCheckpoint:
        warn(f"warning: every local copy in {path} is corrupt; resuming without them")
    except checkpoint.CheckpointError as exc:
        warn(f"warning: not using the local copies in {path}: {exc}")
    except OSError as exc:  # not a directory, no permission: a cache that is not there
        warn(f"warning: cannot read the local copies in {path} ({exc.strerror or exc}); "
             "resuming without them")
    return None


def main(argv: list) -> int:
    """``python -m worker.recovery.localtier remove LOCAL_DIR RUN_DIR``: ``remove_all`` of that run's
    local tier on this host (the launcher's cleanup of a host it took out of the run, where
    no worker of the run is left to do it at the end). ``RUN_DIR`` relative: to the current
    directory (the host's workdir), as the workers' own absolute one. Prints
    ``podlaunch-localtier removed BASE``, or ``podlaunch-localtier none in BASE`` when it held
    no copy; exit 2 on other arguments."""
    if len(argv) != 3 or argv[0] != "remove":
        print("usage: python -m worker.recovery.localtier remove LOCAL_DIR RUN_DIR")
        return 2
    base = base_directory(argv[1], os.path.abspath(argv[2]))
    try:
        held = any(n.startswith("process-") for n in os.listdir(base))
    except OSError:
        held = False
    remove_all(base)
    print(f"podlaunch-localtier {'removed' if held else 'none in'} {base}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
