"""Checkpoints across processes: process 0 saves one copy of the replicated state, and a
resume is restored on every process by a broadcast from whichever process holds the newest
step (process 0's checkpoints or a host's local copy, ``worker.recovery.localtier``).

The files themselves are ``worker.recovery.checkpoint``'s (numpy only); this module is the
part that needs jax and runs collectives (``jax.experimental.multihost_utils``): every
process calls ``restore_broadcast`` and ``broadcast_exact`` together.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from worker.recovery.checkpoint import (ERROR_BYTES, Checkpoint, IncompatibleCheckpoint,
                                        NoUsableCheckpoint, directory, latest, save)


def save_replicated(run_dir: str, step: int, params, opt_state, num_batches: int, keep: int,
                    order: dict | None, unreplicate: Callable) -> str:
    """Process 0: save one copy of replicated ``params`` and ``opt_state`` after ``step``.

    Args:
      run_dir: process 0's run directory (checkpoints go in ``<run_dir>/checkpoints``).
      step: optimizer steps completed.
      params, opt_state: replicated pytrees, every leaf ``[local_device_count, ...]``
        (``pmap``'s layout), or as ``unreplicate`` takes them.
      num_batches: global batches in the dataset (the data position is ``step % num_batches``).
      keep: checkpoints to keep.
      order: ``{"shuffle": bool, "shuffle_seed": int}`` of the data (None: unshuffled).
      unreplicate: a pytree of replicated leaves -> the same of numpy arrays: the
        parallelism's (``worker.trainer.train.unreplicate``, device 0's copy of pmap's layout;
        ``worker.trainer.sharded.unreplicate`` for ``jit``'s global arrays). Handed in, so
        recovery needs nothing of the trainer's.

    Returns:
      The new checkpoint directory.
    """
    import jax

    leaves = jax.tree_util.tree_leaves(unreplicate((params, opt_state)))
    return save(directory(run_dir), Checkpoint(step=step, leaves=leaves, next_batch=step % num_batches,
                                               num_batches=num_batches, order=order), keep)


def restore_broadcast(run_dir: str, process_id: int, state, num_batches: int,
                      warn: Callable[[str], None] = print, order: dict | None = None,
                      local: Checkpoint | None = None):
    """The newest step that process 0's checkpoints or any process's local copy hold,
    restored on every process by a broadcast from the process that holds it.

    Process 0 alone reads the persistent checkpoints, so other hosts need no shared
    filesystem; each process brings its own newest local copy (``worker.recovery.localtier``).
    Every process must call this (it runs collectives: ``multihost_utils.process_allgather``
    of what each holds, then ``broadcast_one_to_all`` from the holder; a tie goes to process
    0's checkpoints, then to the lowest process_id).

    Args:
      run_dir: this process's run directory (only process 0's is read).
      process_id: this process's id.
      state: an unreplicated ``(params, opt_state)`` of the job's shapes and dtypes (zeros:
        ``worker.recovery.recovery.resume``); the template, and the answer when there is no checkpoint.
      num_batches: global batches in the dataset.
      warn: where process 0 reports skipped (corrupt) checkpoints.
      order: this job's data order (``load``).
      local: this process's newest verified local copy (``worker.recovery.localtier.newest``), or None.

    Returns:
      ``(state, step, source)``: the restored state, its step and where it came from (""
      for process 0's checkpoints, else ``process N's local copy``), or ``(state, 0, "")``.

    Raises:
      IncompatibleCheckpoint: process 0's checkpoint does not fit this job, or (as
        ``NoUsableCheckpoint`` on process 0) every checkpoint is corrupt; on every process.
    """
    import jax
    from jax.experimental import multihost_utils

    leaves, treedef = jax.tree_util.tree_flatten(state)
    leaves = [np.asarray(a) for a in leaves]
    found, error = None, ""
    if process_id == 0:
        try:
            found = latest(directory(run_dir), leaves, num_batches, warn, order)
        except (IncompatibleCheckpoint, NoUsableCheckpoint) as exc:
            error = str(exc)
    mine = np.array([-1 if error else int(found is not None), found.step if found else 0,
                     local.step if local is not None else 0], np.int32)  # [status, step, local]
    table = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 3)
    status, step = int(table[0, 0]), int(table[0, 1])
    if status < 0:
        # every process fails with process 0's words: whichever the launcher sees first
        # names the checkpoints and why
        text = np.zeros(ERROR_BYTES, np.uint8)
        raw = error.encode("utf-8", "replace")[:ERROR_BYTES]
        text[:len(raw)] = np.frombuffer(raw, np.uint8)
        got = bytes(np.asarray(multihost_utils.broadcast_one_to_all(text))).rstrip(b"\0")
        raise IncompatibleCheckpoint(got.decode("utf-8", "replace")
                                     or "process 0 could not use its checkpoint (see its log)")
    newest_local = int(table[:, 2].max())
    if max(step, newest_local) == 0:
        return state, 0, ""
    if step >= newest_local:
        holder, source, held = 0, "", found
    else:
        holder = int(np.flatnonzero(table[:, 2] == newest_local)[0])
        step, source, held = newest_local, f"process {holder}'s local copy", local
    mine_leaves = held.leaves if process_id == holder and held is not None else leaves
    got = broadcast_exact(mine_leaves, is_source=process_id == holder)
    return jax.tree_util.tree_unflatten(treedef, got), step, source


def broadcast_exact(leaves: list, is_source: bool) -> list:
    """The source process's ``leaves`` (numpy arrays) on every process, bit for bit.

    ``multihost_utils.broadcast_one_to_all`` sums the source's values with the others'
    zeros, and XLA's CPU all-reduce flushes subnormal floats to zero and turns -0.0 into
    +0.0; so each leaf travels as its bytes (``uint8``, where the sum with zeros is exact)
    and is viewed back as its dtype and shape. Every process must call it with leaves of
    the same shapes and dtypes (the others' values are not used).
    """
    from jax.experimental import multihost_utils

    arrays = [np.asarray(a) for a in leaves]
    raw = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays]
    got = multihost_utils.broadcast_one_to_all(raw, is_source=is_source)
    return [np.asarray(g, np.uint8).view(a.dtype).reshape(a.shape) for g, a in zip(got, arrays)]
