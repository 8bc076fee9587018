"""The job as the worker reads it: ``job.json``, typed, every key required.

Half of the launcher-worker contract (``worker.contract`` has the other half,
the identity in the environment, and the progress lines). Built by the
launcher from its resolved spec (``WorkerJob.from_spec_dict``), written with
``to_json`` (mode 0600: ``task.args`` may hold secrets) and read by the worker
with ``from_json``. No key the worker does not read is sent, and none has a
default here: the spec's defaults live only in ``launcher/spec.py``. What does
not fit raises ``worker.contract.ContractError`` naming the dotted key.

Standard library only, like ``worker.contract``: the launcher imports it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from worker.fields import (ContractError, allowed_types, check_fields, describe_value,
                           expected_type, hints_of, type_ok)


# ---- the job: job.json -----------------------------------------------------------------------
# Exactly the keys the worker reads, every one required. Their meaning, checks
# and defaults are the spec's (launcher/spec.py, the README's table).

class _Section:
    """A job section: its values' types are checked on construction (ContractError)."""

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskConfig(_Section):
    """``task``: ``name`` (built-in or ``package.module:function``) and its keyword ``args``."""

    name: str
    args: dict[str, Any]  # user data, passed as is


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig(_Section):
    """``data``: where the rows come from and in which order (``worker.data``).

    Attributes:
      source: ``synthetic`` or ``file``.
      num_examples, in_features, out_features, noise_std, seed: synthetic data
        (rows, features, targets, std of the Gaussian noise, seed).
      path: file data: absolute path of a .npy, .npz or .csv (None for synthetic).
      target_column: file data (.npy, .csv): index of the target column.
      last_batch: ``drop`` the rows after the last whole global batch, or ``pad``
        it with rows from the start.
      shuffle: a seeded permutation of the rows per epoch (``worker.order``).
      shuffle_seed: its seed.
      prefetch: device calls' batches read and placed ahead (``worker.data.Batches``).
      resident: keep every batch on the devices after its first use (unshuffled only).
      target_dtype: ``float32`` targets ``[rows, 1]`` or ``int32`` labels ``[rows]``
        (.npy, .csv).
    """

    source: str
    num_examples: int
    in_features: int
    out_features: int
    noise_std: float
    seed: int
    path: str | None
    target_column: int
    last_batch: str
    shuffle: bool
    shuffle_seed: int
    prefetch: int
    resident: bool
    target_dtype: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig(_Section):
    """``optimizer`` (``worker.train.make_optimizer``).

    Attributes:
      name: ``sgd``, ``adam`` or ``adamw``.
      learning_rate: step size.
      momentum: sgd only; None is plain SGD.
      weight_decay: adamw only.
    """

    name: str
    learning_rate: float
    momentum: float | None
    weight_decay: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig(_Section):
    """``train``: ``num_steps`` optimizer steps of ``global_batch_size`` examples
    (over all devices); ``seed`` of the parameter initialisation;
    ``steps_per_call`` optimizer steps per device call (``num_steps`` and the
    checkpoint and log steps are multiples of it); ``allreduce``: ``packed``
    (one flat buffer per dtype, one collective per step) or ``per_leaf``;
    ``parallelism``: ``pmap`` (``worker.train``) or ``jit`` (``worker.sharded``);
    ``compilation_cache``: JAX's persistent cache (in the directory the launcher
    names, ``contract.COMPILATION_CACHE_DIR``), or none."""

    num_steps: int
    global_batch_size: int
    seed: int
    steps_per_call: int
    allreduce: str
    parallelism: str
    compilation_cache: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoggingConfig(_Section):
    """``logging``: progress and scalars every ``log_every_steps`` steps; process 0
    writes TensorBoard events when ``tensorboard``; ``on_nonfinite_loss`` is
    ``stop`` or ``warn``."""

    log_every_steps: int
    tensorboard: bool
    on_nonfinite_loss: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedConfig(_Section):
    """``distributed``: ``jax.distributed.initialize``'s timeouts, in seconds."""

    initialization_timeout_s: int
    heartbeat_timeout_s: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig(_Section):
    """``checkpoint``: process 0 saves every ``every_steps`` steps and at the last
    one (0 = never); the newest ``keep`` are kept."""

    every_steps: int
    keep: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class WatchdogConfig(_Section):
    """``watchdog``: ``stall_timeout_s`` (seconds, None = off) paces the heartbeats
    (``heartbeat_interval_s``)."""

    stall_timeout_s: float | None


class _JobFile(_Section):
    """Reading and writing a job file (``job.json``); shared by ``WorkerJob`` and ``ProgramJob``."""

    def to_dict(self) -> dict:
        """Nested plain dicts, in field order (JSON-ready)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "WorkerJob":
        """The job ``to_dict`` made (e.g. read back from JSON).

        Raises:
          ContractError: a key is missing or unknown, a section is not a
            mapping, or a value has the wrong type; it lists every such
            problem, each with its dotted key.
        """
        problems: list = []
        job = _build(cls, d, "", problems)
        if problems:
            raise ContractError("job: " + "; ".join(problems))
        return job

    @classmethod
    def from_spec_dict(cls, resolved: dict) -> "WorkerJob":
        """Pick the worker's keys out of the launcher's ``JobSpec.to_dict()``.

        Everything else in ``resolved`` (``cluster``, ``restarts``,
        ``watchdog.first_step_timeout_s``, ...) is left out.

        Raises:
          ContractError: ``resolved`` lacks a key the worker needs.
        """
        return cls.from_dict(_pick(cls, resolved))

    def to_json(self, path: str) -> None:
        """Write ``to_dict()`` as JSON to ``path``, mode 0600 (it may hold the task's secrets)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    @classmethod
    def from_json(cls, path: str) -> "WorkerJob":
        """Read a job ``to_json`` wrote.

        Raises:
          OSError: the file cannot be read.
          ContractError: it is not JSON, or not a job (see ``from_dict``).
        """
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
        try:
            d = json.loads(text)
        except ValueError as exc:
            raise ContractError(f"{path}: not JSON: {exc}") from None
        try:
            return cls.from_dict(d)
        except ContractError as exc:
            raise ContractError(f"{path}: {exc}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerJob(_JobFile):
    """What one worker trains: the part of the resolved spec the worker reads.

    Attributes:
      name: the job's name (shown in TensorBoard's text tab).
      task, data, optimizer, train, logging, distributed, checkpoint, watchdog:
        the spec's sections of the same names, each with only the keys the
        worker reads.
      secrets: the spec's ``secrets`` (key names masked, with ``worker.redact``'s
        rule, in what the worker writes: TensorBoard's spec text and hparams).
    """

    name: str
    secrets: list[str]
    task: TaskConfig
    data: DataConfig
    optimizer: OptimizerConfig
    train: TrainConfig
    logging: LoggingConfig
    distributed: DistributedConfig
    checkpoint: CheckpointConfig
    watchdog: WatchdogConfig



@dataclasses.dataclass(frozen=True, kw_only=True)
class ProgramConfig(_Section):
    """``program``: ``num_steps`` the program will report (None: it did not say)."""

    num_steps: int | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProgramJob(_JobFile):
    """What ``worker.program`` (the helper a user's program calls) reads: a program job's
    ``job.json``. The trainer's sections are absent: the program trains itself.

    Attributes:
      name, secrets, logging, distributed, watchdog: as in ``WorkerJob``.
      program: what the helper needs to know of the program (``num_steps``).
    """

    name: str
    secrets: list[str]
    program: ProgramConfig
    logging: LoggingConfig
    distributed: DistributedConfig
    watchdog: WatchdogConfig


def for_spec_dict(resolved: dict) -> WorkerJob:
    """The job.json of a resolved spec: a ``ProgramJob`` for a program job, else a ``WorkerJob``."""
    return (ProgramJob if resolved.get("program") else WorkerJob).from_spec_dict(resolved)


def read(path: str) -> WorkerJob:
    """Read ``job.json`` as whichever job it holds (``ProgramJob`` when it has ``program``)."""
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    try:
        is_program = "program" in json.loads(text)
    except (ValueError, TypeError):
        is_program = False
    return (ProgramJob if is_program else WorkerJob).from_json(path)


def _build(cls, d: Any, prefix: str, problems: list):
    """Build dataclass ``cls`` from mapping ``d``; append ``"dotted.key: problem"`` to ``problems``."""
    if not isinstance(d, dict):
        problems.append(f"{prefix.rstrip('.') or '(top level)'}: expected a mapping, "
                        f"got {describe_value(d)}")
        return None
    hints = hints_of(cls)
    names = [field.name for field in dataclasses.fields(cls)]
    problems += [f"{prefix}{key}: unknown key" for key in d if key not in names]
    values, ok = {}, True
    for name in names:
        key = prefix + name
        if name not in d:
            problems.append(f"{key}: missing")
            ok = False
        elif dataclasses.is_dataclass(hints[name]):
            values[name] = _build(hints[name], d[name], key + ".", problems)
            ok = ok and values[name] is not None
        elif not type_ok(d[name], allowed_types(hints[name])):
            problems.append(f"{key}: expected {expected_type(hints[name])}, got {describe_value(d[name])}")
            ok = False
        else:
            values[name] = d[name]
    return cls(**values) if ok else None


def _pick(cls, resolved: Any) -> Any:
    """The keys of dataclass ``cls`` (recursively) out of ``resolved``; others are dropped."""
    if not isinstance(resolved, dict):
        return resolved  # from_dict names it
    hints = hints_of(cls)
    return {name: (_pick(hints[name], resolved[name]) if dataclasses.is_dataclass(hints[name])
                   else list(resolved[name]) if isinstance(resolved[name], tuple)  # as JSON has it
                   else resolved[name])
            for name in (field.name for field in dataclasses.fields(cls)) if name in resolved}
