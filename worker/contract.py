"""The launcher-worker contract: the worker's identity, its job, and progress lines.

This module is the single definition of what crosses the launcher -> worker
boundary and how a worker reports progress back. It imports nothing heavy (no
jax, no numpy; stdlib only), so the launcher can import it and stay instant.

Two typed halves, built by the launcher and read by the worker:

* ``Identity``: who this process is, passed in the environment
  (``Identity.to_env`` / ``Identity.from_env``).
* ``WorkerJob``: what to train, passed as ``job.json``
  (``WorkerJob.from_spec_dict`` picks it out of the launcher's resolved spec;
  ``WorkerJob.to_json`` / ``WorkerJob.from_json``). Every key is required and
  no key the worker does not read is sent: the spec's defaults live only in
  ``launcher/spec.py``.

Both raise ``ContractError`` (naming the variable or the dotted key) for what
does not fit; the worker exits with ``EXIT_MISMATCH`` then.

Environment (all values are strings):
  PODLAUNCH_COORDINATOR_ADDRESS  ``host:port`` of JAX's coordination service,
                                 identical for every process.
  PODLAUNCH_NUM_PROCESSES        ``num_processes`` of ``jax.distributed.initialize``.
  PODLAUNCH_PROCESS_ID           this process's ``process_id``, 0 .. num_processes-1.
  PODLAUNCH_LOCAL_DEVICE_COUNT   devices the plan expects this process to see.
  PODLAUNCH_PLATFORM             platform the plan expects (``cpu``, ``gpu``, ``tpu``).
  PODLAUNCH_JOB                  path of the job (``WorkerJob`` as JSON) the worker runs.
  PODLAUNCH_RUN_DIR              directory for TensorBoard events, checkpoints and
                                 final params (written by process 0 only).

Optional (set by the launcher's restart loop and ``--resume``, and by the tpu backend):
  PODLAUNCH_ATTEMPT              0 for the first attempt, n for the n-th restart.
  PODLAUNCH_RESUME               "1": process 0 restores the latest complete
                                 checkpoint of its run directory and broadcasts it;
                                 "0" (or unset): start at step 1.
  PODLAUNCH_CLUSTER_DETECTION_METHOD  see ``CLUSTER_DETECTION_METHOD`` below.

Progress lines: a worker prints ``PROGRESS_FORMAT`` lines at every logged step,
``HEARTBEAT_FORMAT`` lines at most every ``heartbeat_interval_s`` between them
(for the launcher's stall watchdog; the launcher does not echo them), and
``FAILED_FORMAT`` when it dies of an exception; the launcher parses all three
with ``parse_step`` to know the step each process reached, and when.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import types
import typing
from typing import Any, NamedTuple

COORDINATOR_ADDRESS = "PODLAUNCH_COORDINATOR_ADDRESS"
NUM_PROCESSES = "PODLAUNCH_NUM_PROCESSES"
PROCESS_ID = "PODLAUNCH_PROCESS_ID"
LOCAL_DEVICE_COUNT = "PODLAUNCH_LOCAL_DEVICE_COUNT"
PLATFORM = "PODLAUNCH_PLATFORM"
JOB = "PODLAUNCH_JOB"
RUN_DIR = "PODLAUNCH_RUN_DIR"

ALL = (COORDINATOR_ADDRESS, NUM_PROCESSES, PROCESS_ID, LOCAL_DEVICE_COUNT,
       PLATFORM, JOB, RUN_DIR)
ATTEMPT = "PODLAUNCH_ATTEMPT"
RESUME = "PODLAUNCH_RESUME"

# "step 40/100 loss 0.012345 | 812.3 steps/s | step_time_s 0.001231 (own 0.000402)"
# step_time_s: wall seconds per step since the previous logged step (equal on
# every process of a synchronous run); own: the part of it this process spent
# outside JAX, on its own host work: the number that singles out a straggler
# (see worker/metrics.py).
PROGRESS_FORMAT = ("step {step}/{num_steps} loss {loss:.6g} | {steps_per_s:.1f} steps/s"
                   " | step_time_s {step_time_s:.6g} (own {own_step_time_s:.6g})")
PROGRESS_RE = re.compile(
    r"^step (?P<step>\d+)/(?P<num_steps>\d+) loss (?P<loss>\S+) \| (?P<steps_per_s>\S+) steps/s"
    r"(?: \| step_time_s (?P<step_time_s>\S+) \(own (?P<own_step_time_s>\S+)\))?")
FAILED_FORMAT = "failed at step {step}: {error}"
HEARTBEAT_FORMAT = "podlaunch-heartbeat step {step}"
# Every process of a resumed attempt, before its first step: the steps before
# N + 1 were done by an earlier attempt (the launcher's mean step time needs it).
RESUMED_FORMAT = "resumed from the checkpoint of step {step} (attempt {attempt})"
RESUMED_RE = re.compile(r"^resumed from the checkpoint of step (?P<step>\d+) \(attempt \d+\)$")
# Process 0, once a checkpoint is complete (renamed into place): over ssh the
# launcher copies it from host 0 into the local run directory when it sees this.
CHECKPOINT_FORMAT = "checkpoint of step {step} saved: {path}"
STEP_RE = re.compile(r"^(?:step (?P<done>\d+)/\d+ |failed at step (?P<failed>\d+):"
                     r"|podlaunch-heartbeat step (?P<beat>\d+)$)")

# Exit code a worker uses when its own checks (identity, devices) fail.
EXIT_MISMATCH = 3


class Progress(NamedTuple):
    """One parsed progress line; times in seconds (None when the line predates them)."""

    step: int
    num_steps: int
    loss: float
    steps_per_s: float
    step_time_s: float | None
    own_step_time_s: float | None


def parse_progress(line: str) -> "Progress | None":
    """Return the ``Progress`` a ``PROGRESS_FORMAT`` line reports, or None for any other line."""
    match = PROGRESS_RE.match(line)
    if match is None:
        return None
    try:
        times = [None if match.group(k) is None else float(match.group(k))
                 for k in ("step_time_s", "own_step_time_s")]
        return Progress(int(match.group("step")), int(match.group("num_steps")),
                        float(match.group("loss")), float(match.group("steps_per_s")), *times)
    except ValueError:
        return None


def parse_step(line: str):
    """Return the step number a progress or failure line reports, or None."""
    match = STEP_RE.match(line)
    if match is None:
        return None
    return int(match.group("done") or match.group("failed") or match.group("beat"))


def parse_resumed_step(line: str):
    """The checkpoint step a ``RESUMED_FORMAT`` line names, or None for any other line."""
    match = RESUMED_RE.match(line)
    return int(match.group("step")) if match else None


# A run directory's checkpoints: <run_dir>/CHECKPOINTS_DIR/step-NNNNNNN/, each
# complete once it has that name (worker.checkpoint renames it into place).
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_DIR_RE = re.compile(r"^step-(\d{7,})$")


def checkpoints_in(names) -> list:
    """``(step, name)`` of the checkpoint directories among ``names``, oldest first."""
    return sorted((int(m.group(1)), name) for name in names if (m := CHECKPOINT_DIR_RE.match(name)))


def is_checkpoint_saved(line: str) -> bool:
    """Whether ``line`` is process 0's ``CHECKPOINT_FORMAT`` line."""
    return line.startswith("checkpoint of step ") and " saved: " in line


def is_failure(line: str) -> bool:
    """Whether ``line`` is a worker's own ``FAILED_FORMAT`` report (it names the exact step)."""
    return line.startswith("failed at step ")


def is_heartbeat(line: str) -> bool:
    """Whether ``line`` is a heartbeat (progress for the watchdog, noise for people)."""
    return line.startswith("podlaunch-heartbeat step ")


def heartbeat_interval_s(stall_timeout_s: float | None) -> float | None:
    """Seconds between a worker's heartbeats: a tenth of the stall timeout, 0.5 to 10 s.

    None (no heartbeats) when the watchdog is off. Each heartbeat waits for the
    current step to finish on the device (one sync per interval, not per step),
    so it proves progress rather than dispatch.
    """
    if not stall_timeout_s:
        return None
    return min(10.0, max(0.5, stall_timeout_s / 10))

# Optional: JAX's cluster_detection_method for jax.distributed.initialize.
# "deactivate" (the default): the launcher's process_id and num_processes are
# used as given; "gcetpu": JAX reads them from the TPU VM's metadata and the
# worker checks them against the plan.
CLUSTER_DETECTION_METHOD = "PODLAUNCH_CLUSTER_DETECTION_METHOD"


class ContractError(Exception):
    """What the launcher handed a worker does not fit this contract.

    A missing or malformed environment variable, or a job that lacks a key,
    has one too many, or holds a value of the wrong type; the message names
    the variable or the dotted key.
    """


# ---- the identity: the environment -----------------------------------------------------------
_BOOL_ENV = {"0": False, "1": True}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Identity:
    """Who one worker process is; the launcher's plan for it, checked on construction.

    Attributes:
      coordinator_address: ``host:port`` of JAX's coordination service.
      num_processes: processes in the job (>= 1).
      process_id: this process's id, 0 .. num_processes-1.
      local_device_count: devices this process must see (>= 1).
      platform: the platform its devices must report (``cpu``, ``gpu``, ``tpu``).
      job_path: path of the job JSON (``WorkerJob``) as this process sees it.
      run_dir: the run directory as this process sees it.
      attempt: 0 for the first attempt, n for the n-th restart.
      resume: process 0 restores the latest complete checkpoint first.
      cluster_detection_method: JAX's ``cluster_detection_method`` for
        ``jax.distributed.initialize``; None means ``"deactivate"`` (the ids
        above are used as given).

    Raises (on construction):
      ContractError: a value of the wrong type or out of range.
    """

    coordinator_address: str
    num_processes: int
    process_id: int
    local_device_count: int
    platform: str
    job_path: str
    run_dir: str
    attempt: int = 0
    resume: bool = False
    cluster_detection_method: str | None = None

    def __post_init__(self):
        _check_fields(self)
        if self.num_processes < 1:
            raise ContractError(f"num_processes is {self.num_processes}, expected >= 1")
        if not 0 <= self.process_id < self.num_processes:
            raise ContractError(f"process_id {self.process_id} is outside "
                                f"0..{self.num_processes - 1}")
        if self.local_device_count < 1:
            raise ContractError(f"local_device_count is {self.local_device_count}, expected >= 1")
        if self.attempt < 0:
            raise ContractError(f"attempt is {self.attempt}, expected >= 0")

    def to_env(self) -> dict[str, str]:
        """The environment variables that carry this identity, in a fixed order.

        The optional ones (attempt, resume, cluster_detection_method) are set
        only when they differ from their defaults: the launcher's restart loop
        and the tpu backend add them per attempt and per host.
        """
        env = {
            COORDINATOR_ADDRESS: self.coordinator_address,
            NUM_PROCESSES: str(self.num_processes),
            PROCESS_ID: str(self.process_id),
            LOCAL_DEVICE_COUNT: str(self.local_device_count),
            PLATFORM: self.platform,
            JOB: self.job_path,
            RUN_DIR: self.run_dir,
        }
        if self.attempt:
            env[ATTEMPT] = str(self.attempt)
        if self.resume:
            env[RESUME] = "1"
        if self.cluster_detection_method is not None:
            env[CLUSTER_DETECTION_METHOD] = self.cluster_detection_method
        return env

    @classmethod
    def from_env(cls, environ: typing.Mapping[str, str]) -> "Identity":
        """Read the identity the launcher put in ``environ`` (e.g. ``os.environ``).

        An empty variable counts as unset.

        Raises:
          ContractError: a required variable is missing, a value is malformed
            (not an integer, a resume flag other than 0/1), or process_id is
            outside 0..num_processes-1.
        """
        missing = [name for name in ALL if not environ.get(name)]
        if missing:
            raise ContractError(f"missing environment {', '.join(missing)}: "
                                "start workers with `launch`")

        def integer(name: str, default: str | None = None) -> int:
            text = environ.get(name) or default
            try:
                return int(text)
            except ValueError:
                raise ContractError(f"malformed identity in the environment: {name}={text!r} "
                                    "is not an integer") from None

        resume = environ.get(RESUME) or "0"
        if resume not in _BOOL_ENV:
            raise ContractError(f"malformed identity in the environment: {RESUME}={resume!r}, "
                                "expected 0 or 1")
        return cls(
            coordinator_address=environ[COORDINATOR_ADDRESS],
            num_processes=integer(NUM_PROCESSES),
            process_id=integer(PROCESS_ID),
            local_device_count=integer(LOCAL_DEVICE_COUNT),
            platform=environ[PLATFORM],
            job_path=environ[JOB],
            run_dir=environ[RUN_DIR],
            attempt=integer(ATTEMPT, "0"),
            resume=_BOOL_ENV[resume],
            cluster_detection_method=environ.get(CLUSTER_DETECTION_METHOD) or None,
        )


# ---- the job: job.json -----------------------------------------------------------------------
# Exactly the keys the worker reads, every one required. Their meaning, checks
# and defaults are the spec's (launcher/spec.py, the README's table).

class _Section:
    """A job section: its values' types are checked on construction (ContractError)."""

    def __post_init__(self):
        _check_fields(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskConfig(_Section):
    """``task``: ``name`` (built-in or ``package.module:function``) and its keyword ``args``."""

    name: str
    args: dict[str, Any]  # user data, passed as is


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig(_Section):
    """``data``: where the rows come from (``worker.data.load_shard``).

    Attributes:
      source: ``synthetic`` or ``file``.
      num_examples, in_features, out_features, noise_std, seed: synthetic data
        (rows, features, targets, std of the Gaussian noise, seed).
      path: file data: absolute path of a .npy, .npz or .csv (None for synthetic).
      target_column: file data (.npy, .csv): index of the target column.
    """

    source: str
    num_examples: int
    in_features: int
    out_features: int
    noise_std: float
    seed: int
    path: str | None
    target_column: int


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
    (over all devices); ``seed`` of the parameter initialisation."""

    num_steps: int
    global_batch_size: int
    seed: int


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerJob(_Section):
    """What one worker trains: the part of the resolved spec the worker reads.

    Attributes:
      name: the job's name (shown in TensorBoard's text tab).
      task, data, optimizer, train, logging, distributed, checkpoint, watchdog:
        the spec's sections of the same names, each with only the keys the
        worker reads.
    """

    name: str
    task: TaskConfig
    data: DataConfig
    optimizer: OptimizerConfig
    train: TrainConfig
    logging: LoggingConfig
    distributed: DistributedConfig
    checkpoint: CheckpointConfig
    watchdog: WatchdogConfig

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


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _allowed(hint) -> tuple:
    """The runtime types a field's annotation admits (an int is a float; a bool is no int)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = typing.get_args(hint) if union else (hint,)
    out: list = []
    for option in options:
        option = typing.get_origin(option) or option
        out += [int, float] if option is float else [type(None) if option is None else option]
    return tuple(out)


def _type_ok(value: Any, allowed: tuple) -> bool:
    if isinstance(value, bool) and bool not in allowed:
        return False
    return isinstance(value, allowed)


def _expected(hint) -> str:
    allowed = _allowed(hint)
    return " or ".join("null" if t is type(None) else t.__name__
                       for t in allowed if t is not int or float not in allowed)


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _check_fields(obj) -> None:
    """Raise ContractError for the first field of dataclass ``obj`` of the wrong type."""
    for field in dataclasses.fields(obj):
        hint = _hints(type(obj))[field.name]
        value = getattr(obj, field.name)
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, hint):
                raise ContractError(f"{field.name}: expected {hint.__name__}, "
                                    f"got {_describe(value)}")
            continue
        if not _type_ok(value, _allowed(hint)):
            raise ContractError(f"{field.name}: expected {_expected(hint)}, "
                                f"got {_describe(value)}")


def _build(cls, d: Any, prefix: str, problems: list):
    """Build dataclass ``cls`` from mapping ``d``; append ``"dotted.key: problem"`` to ``problems``."""
    if not isinstance(d, dict):
        problems.append(f"{prefix.rstrip('.') or '(top level)'}: expected a mapping, "
                        f"got {_describe(d)}")
        return None
    hints = _hints(cls)
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
        elif not _type_ok(d[name], _allowed(hints[name])):
            problems.append(f"{key}: expected {_expected(hints[name])}, got {_describe(d[name])}")
            ok = False
        else:
            values[name] = d[name]
    return cls(**values) if ok else None


def _pick(cls, resolved: Any) -> Any:
    """The keys of dataclass ``cls`` (recursively) out of ``resolved``; others are dropped."""
    if not isinstance(resolved, dict):
        return resolved  # from_dict names it
    hints = _hints(cls)
    return {name: (_pick(hints[name], resolved[name]) if dataclasses.is_dataclass(hints[name])
                   else resolved[name])
            for name in (field.name for field in dataclasses.fields(cls)) if name in resolved}
