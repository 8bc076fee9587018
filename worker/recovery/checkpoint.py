"""Checkpoints: complete or absent, never half-written; restored by process 0 only.

Layout, inside process 0's run directory::

    checkpoints/
      step-0000040/
        state.npz       every leaf of (params, opt_state), unreplicated: leaf_00000, leaf_00001, ...
        manifest.json   step, data position, leaf shapes/dtypes, size and sha256 of state.npz
      step-0000050/ ...

A checkpoint is written into a hidden ``.tmp-...`` directory, fsynced, and
renamed into place (a rename within one filesystem is atomic, POSIX
rename(2)); readers only look at ``step-*`` directories, so a writer killed
half-way leaves nothing a reader would take. A checkpoint damaged later
(truncated, flipped bits) fails its sha256 check and is skipped for the
previous one, with a warning. Only the last ``keep`` checkpoints are kept.

This module uses numpy only (no jax): the caller flattens and unflattens the
pytrees, and process 0 broadcasts what it read (``worker.trainer.main``), so other
hosts need no shared filesystem.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
from typing import Callable

import numpy as np

from worker import contract
from worker.contract import nodefacts, runfiles

STATE_FILE = "state.npz"
MANIFEST_FILE = "manifest.json"
FORMAT = 1


@functools.lru_cache(maxsize=1)
def _version() -> str | None:
    """This podlaunch's version, read from its metadata once (not at every save)."""
    return nodefacts.version("podlaunch")


class CheckpointError(Exception):
    """A checkpoint cannot be used: corrupt (skippable) or not this job's (not skippable)."""


ERROR_BYTES = 4096  # of process 0's checkpoint error, sent to every process


class NoUsableCheckpoint(CheckpointError):
    """Checkpoints exist but none verifies: resuming would silently start over."""


class IncompatibleCheckpoint(CheckpointError):
    """A complete checkpoint that does not fit the job (other model shapes or data)."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint holds.

    Attributes:
      step: optimizer steps completed when it was saved (>= 1).
      leaves: the flattened ``(params, opt_state)`` leaves, unreplicated numpy arrays.
      next_batch: index of the global batch the next step uses (the data position).
      num_batches: global batches in the dataset when it was saved.
      path: the checkpoint directory.
      order: how the data was ordered (``{"shuffle": bool, "shuffle_seed": int}``;
        None: unshuffled, as checkpoints from before shuffling). With the step it
        fixes the data position (``worker.data.order.Order.position``: epoch, offset
        in the global order), which is topology-free.
    """

    step: int
    leaves: list
    next_batch: int
    num_batches: int
    path: str = ""
    order: dict | None = None


def directory(run_dir: str) -> str:
    """``<run_dir>/checkpoints``."""
    return os.path.join(run_dir, contract.CHECKPOINTS_DIR)


def step_dir(ckpt_dir: str, step: int) -> str:
    return os.path.join(ckpt_dir, f"step-{step:07d}")


def list_steps(ckpt_dir: str) -> list[int]:
    """Steps of the (complete-looking) checkpoints in ``ckpt_dir``, oldest first."""
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return []
    return [step for step, _ in contract.checkpoints_in(names)]


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", opener=runfiles.opener) as f:  # never through a planted link
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save(ckpt_dir: str, ckpt: Checkpoint, keep: int) -> str:
    """Write ``ckpt`` atomically as ``step-NNNNNNN`` and keep only the newest ``keep``.

    Args:
      ckpt_dir: the checkpoints directory (created if missing).
      ckpt: what to save; ``leaves`` are numpy arrays (any dtype, any shape).
      keep: how many checkpoints to keep (>= 1); older ones are deleted.

    Returns:
      The path of the new checkpoint directory.

    Raises:
      OSError: the disk refused (nothing half-written is left under a step-* name, and
        the half-written copy is removed); its ``filename`` names the checkpoint.
    """
    os.makedirs(ckpt_dir, exist_ok=True)
    final = step_dir(ckpt_dir, ckpt.step)
    tmp = os.path.join(ckpt_dir, f".tmp-step-{ckpt.step:07d}-{os.getpid()}")
    try:
        return _save(ckpt_dir, ckpt, keep, final, tmp)
    except OSError as exc:  # a full disk: give back what the half-save took, name where
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, final) from exc
        raise


def _save(ckpt_dir: str, ckpt: Checkpoint, keep: int, final: str, tmp: str) -> str:
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    state = os.path.join(tmp, STATE_FILE)
    with open(state, "wb", opener=runfiles.opener) as f:
        np.savez(f, **{f"leaf_{i:05d}": np.asarray(a) for i, a in enumerate(ckpt.leaves)})
        f.flush()
        os.fsync(f.fileno())
    manifest = {
        "format": FORMAT, "written_by": f"podlaunch {_version()}",
        "step": ckpt.step,
        "data": {"next_batch": ckpt.next_batch, "num_batches": ckpt.num_batches,
                 "epoch": ckpt.step // ckpt.num_batches, **(ckpt.order or {})},
        "leaves": [{"shape": list(np.shape(a)), "dtype": str(np.asarray(a).dtype)} for a in ckpt.leaves],
        "state_file": {"name": STATE_FILE, "size_bytes": os.path.getsize(state), "sha256": _sha256(state)},
    }
    with open(os.path.join(tmp, MANIFEST_FILE), "w", encoding="utf-8", opener=runfiles.opener) as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync(tmp)
    if os.path.exists(final):  # a step redone after resuming from an older checkpoint
        old = final + f".old-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync(ckpt_dir)
    _prune(ckpt_dir, keep)
    return final


def _prune(ckpt_dir: str, keep: int) -> None:
    for step in list_steps(ckpt_dir)[:-keep]:
        shutil.rmtree(step_dir(ckpt_dir, step), ignore_errors=True)
    for name in os.listdir(ckpt_dir):  # leftovers of writers that died mid-save
        if name.startswith(".tmp-step-") and not name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(os.path.join(ckpt_dir, name), ignore_errors=True)


def load(path: str, template: list, num_batches: int, order: dict | None = None) -> Checkpoint:
    """Read and verify one checkpoint directory against the job's state.

    Args:
      path: a ``step-NNNNNNN`` directory.
      template: leaves of the freshly initialised ``(params, opt_state)``;
        the checkpoint's leaves must have the same count, shapes and dtypes.
      num_batches: global batches in this job's dataset.
      order: this job's ``{"shuffle": bool, "shuffle_seed": int}`` (None: unshuffled).

    Returns:
      The verified Checkpoint.

    Raises:
      CheckpointError: missing/unreadable files, a size or sha256 mismatch (corrupt).
      IncompatibleCheckpoint: complete, but other shapes, dtypes or data than this job.
    """
    try:
        with open(os.path.join(path, MANIFEST_FILE), "r", encoding="utf-8", opener=runfiles.opener) as f:
            manifest = json.load(f)
        fmt = manifest.get("format")
        state = os.path.join(path, manifest["state_file"]["name"])
        size, digest = manifest["state_file"]["size_bytes"], manifest["state_file"]["sha256"]
        step, data = int(manifest["step"]), manifest["data"]
        specs = manifest["leaves"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"unreadable manifest: {type(exc).__name__}: {exc}") from None
    if fmt != FORMAT:  # a later (or unknown) layout: reading it as ours would restore garbage
        raise IncompatibleCheckpoint(
            f"its manifest is format {fmt!r}, written by {manifest.get('written_by', 'an unknown version')}; "
            f"this podlaunch ({_version()}) reads format {FORMAT} only: resume "
            "with the version that wrote it, or start a new run")
    try:
        got_size = os.path.getsize(state)
    except OSError as exc:
        raise CheckpointError(f"{STATE_FILE}: {exc.strerror}") from None
    if got_size != size:
        raise CheckpointError(f"{STATE_FILE} is {got_size} bytes, the manifest says {size} (truncated?)")
    if _sha256(state) != digest:
        raise CheckpointError(f"{STATE_FILE} fails its sha256 check (corrupt)")
    want = [{"shape": list(np.shape(a)), "dtype": str(np.asarray(a).dtype)} for a in template]
    if specs != want:
        raise IncompatibleCheckpoint(
            f"its {len(specs)} leaves {[(s['shape'], s['dtype']) for s in specs]} differ from this "
            f"job's {[(s['shape'], s['dtype']) for s in want]}: a different model or optimizer")
    if data["num_batches"] != num_batches or data["next_batch"] != step % num_batches:
        raise IncompatibleCheckpoint(
            f"data position {data['next_batch']} of {data['num_batches']} batches does not fit this "
            f"job's data ({step % num_batches} of {num_batches} at step {step}): different data or batch size")
    theirs = _order(data)
    if theirs != _order(order or {}):
        raise IncompatibleCheckpoint(
            f"its data order ({_order_text(theirs)}) differs from this job's "
            f"({_order_text(_order(order or {}))}): resuming would not see the batches the run "
            "would have seen; set data.shuffle and data.shuffle_seed as the run that saved it")
    with np.load(state) as arrays:
        leaves = [arrays[f"leaf_{i:05d}"] for i in range(len(specs))]
    return Checkpoint(step=step, leaves=leaves, next_batch=data["next_batch"],
                      num_batches=data["num_batches"], path=path, order=theirs)


def _order(data: dict) -> dict:
    """The order part of a data position; an unshuffled one's seed does not matter."""
    shuffle = bool(data.get("shuffle", False))
    return {"shuffle": shuffle, "shuffle_seed": int(data.get("shuffle_seed", 0)) if shuffle else 0}


def _order_text(order: dict) -> str:
    return f"shuffled, seed {order['shuffle_seed']}" if order["shuffle"] else "not shuffled"


def latest(ckpt_dir: str, template: list, num_batches: int,
           warn: Callable[[str], None] = print, order: dict | None = None) -> Checkpoint | None:
    """The newest checkpoint that verifies; corrupt newer ones are skipped with a warning.

    Returns:
      The Checkpoint, or None when ``ckpt_dir`` holds no checkpoint at all.

    Raises:
      IncompatibleCheckpoint: the newest complete checkpoint belongs to another job.
      NoUsableCheckpoint: there are checkpoints and every one is corrupt (each
        named with why); starting over would train from step 1 and overwrite them.
    """
    skipped = []
    for step in reversed(list_steps(ckpt_dir)):
        path = step_dir(ckpt_dir, step)
        try:
            return load(path, template, num_batches, order)
        except IncompatibleCheckpoint:
            raise
        except CheckpointError as exc:
            skipped.append(f"{path}: {exc}")
            warn(f"warning: skipping checkpoint {path}: {exc}; trying the previous one")
    if skipped:
        raise NoUsableCheckpoint(
            f"every checkpoint in {ckpt_dir} is corrupt, so nothing can be resumed and nothing "
            f"was touched: {'; '.join(skipped)}. Restore them, or start a new run without --resume")
    return None
