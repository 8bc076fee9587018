"""The launcher-worker contract: the worker's identity, its job, and progress lines.

The package is the one place where what crosses the launcher-worker boundary is written (its
modules: ``job``, ``sections``, ``signals``, ``notice``, ``profiling``, ``metrics``, ``causes``...);
this one holds the identity and the progress lines. Standard library only: the launcher is instant.

Two typed halves, built by the launcher and read by the worker:

* ``Identity``: who this process is, passed in the environment
  (``Identity.to_env`` / ``Identity.from_env``).
* ``worker.contract.job.WorkerJob``: what to train, passed as ``job.json``. Every key
  is required and no key the worker does not read is sent: the spec's
  defaults live only in ``launcher/spec/__init__.py``.

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
  PODLAUNCH_RENDEZVOUS           "stdin" (the slurm backend): the coordinator's port is
                                 not known at start; see ``RENDEZVOUS`` below.
  PODLAUNCH_COMPILATION_CACHE_DIR  JAX's persistent compilation cache as this process
                                 sees it (``train.compilation_cache``); unset:
                                 ``<run dir>/compilation-cache``. The launcher sets it
                                 (``launcher.plan.compilation_cache_dir``).

Progress lines: a worker prints ``PROGRESS_FORMAT`` lines at every logged step,
``HEARTBEAT_FORMAT`` lines at most every ``heartbeat_interval_s`` between them
(for the launcher's stall watchdog; the launcher does not echo them), and
``FAILED_FORMAT`` when it dies of an exception; the launcher parses all three
with ``parse_step`` to know the step each process reached, and when.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import NamedTuple

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
# Optional: comma-separated ids of the local devices this process uses (GPU),
# passed to jax.distributed.initialize as local_device_ids. Unset: every
# visible device (and never JAX's guess from SLURM_LOCALID).
LOCAL_DEVICE_IDS = "PODLAUNCH_LOCAL_DEVICE_IDS"
RESUME = "PODLAUNCH_RESUME"
COMPILATION_CACHE_DIR = "PODLAUNCH_COMPILATION_CACHE_DIR"
# The compilation cache's directory name: in the job's directory (runs/<job>/) for a run
# in the default layout, else in the run directory (launcher.plan.compilation_cache_dir).
COMPILATION_CACHE = "compilation-cache"

# "step 40/100 loss 0.012345 | 812.3 steps/s | step_time_s 0.001231 (own 0.000402)": wall
# seconds per step since the last logged step (equal on every process), and own: this process's
# host work outside JAX, what singles out a straggler (worker/telemetry/metrics.py).
PROGRESS_FORMAT = ("step {step}/{num_steps} loss {loss:.6g} | {steps_per_s:.1f} steps/s"
                   " | step_time_s {step_time_s:.6g} (own {own_step_time_s:.6g})")
PROGRESS_RE = re.compile(
    r"^step (?P<step>\d+)/(?P<num_steps>\d+) loss (?P<loss>\S+) \| (?P<steps_per_s>\S+) steps/s"
    r"(?: \| step_time_s (?P<step_time_s>\S+) \(own (?P<own_step_time_s>\S+)\))?")
FAILED_PREFIX = "failed at step "
FAILED_FORMAT = FAILED_PREFIX + "{step}: {error}"
# Just before FAILED_FORMAT: when (time.time(), the host's clock) the worker caught its error; a
# cascade's victims catch theirs after the cause died, so the launcher leads with the earliest.
FAILED_TIME_FORMAT = "podlaunch-failed-at {at:.6f}"
FAILED_TIME_RE = re.compile(r"^podlaunch-failed-at (?P<at>\d+(?:\.\d+)?)$")
DETAIL_BEGIN, DETAIL_END = "traceback of the failure above:", "end of the traceback"  # log only
HEARTBEAT_PREFIX = "podlaunch-heartbeat step "
HEARTBEAT_FORMAT = HEARTBEAT_PREFIX + "{step}"
# Every process of a resumed attempt, before its first step: the steps before N + 1 were done
# by an earlier attempt, the restore's wall seconds (launcher.run.ledger), ": process N's local copy"
RESUMED_FORMAT = "resumed from the checkpoint of step {step} (attempt {attempt}) in {seconds:.3f} s"
RESUMED_RE = re.compile(r"^resumed from the checkpoint of step (?P<step>\d+) \(attempt \d+\)"
                        r"(?: in (?P<seconds>[0-9.]+) s)?(?:: .*)?$")
# Every process after its first call: JAX's persistent cache's hits and misses (its own
# events) and that call's wall seconds ("?" unknown); the launcher's summary shows them.
CACHE_FORMAT = ("compilation cache: {hits} hits, {misses} misses; first step (trace, compile, "
                "dispatch) {seconds} s ({path})")
CACHE_RE = re.compile(r"^compilation cache: (?P<hits>\d+) hits, (?P<misses>\d+) misses; first step "
                      r"\(trace, compile, dispatch\) (?P<seconds>[0-9.]+|\?) s")
# Process 0, once a checkpoint is complete (renamed into place), with the save's seconds:
# over ssh the launcher copies it from host 0 to the local run directory when it sees this.
CHECKPOINT_FORMAT = "checkpoint of step {step} saved in {seconds:.3f} s: {path}"
CHECKPOINT_RE = re.compile(r"^checkpoint of step (?P<step>\d+) saved(?: in (?P<seconds>[0-9.]+) s)?: ")
STEP_RE = re.compile(rf"^(?:step (?P<done>\d+)/\d+ |{re.escape(FAILED_PREFIX)}(?P<failed>\d+):"
                     rf"|{re.escape(HEARTBEAT_PREFIX)}(?P<beat>\d+)$)")
_STEP_HEADS = ("step ", FAILED_PREFIX, HEARTBEAT_PREFIX)
EXIT_MISMATCH = 3  # the exit code of a worker whose own checks (identity, devices) failed

# The slurm backend starts every process at once, without a probe step before them
# (bench/bench_slurm.py): with RENDEZVOUS=stdin a worker first prints one line,
# FACTS_PREFIX + JSON of ``worker.contract.nodefacts.facts`` (versions; process 0 also the
# coordinator port of its address, 0 for any free one, checked free on its node),
# then imports jax while the launcher compares every node's facts, and then reads
# the coordinator's ``host:port`` as one line on stdin. End of input instead: the
# launcher refused the start; the worker exits EXIT_MISMATCH.
RENDEZVOUS = "PODLAUNCH_RENDEZVOUS"
FACTS_PREFIX = "podlaunch-facts "

# Around jax.distributed.initialize: JOINING before, JOINED after. A process that
# dies in between (JAX aborts with SIGABRT when the coordinator cannot be reached
# within initialization_timeout_s; a Python error exits EXIT_INIT after an
# INIT_FAILED line) failed to join: a configuration or network problem that a
# restart does not fix.
JOINING_FORMAT = "joining the coordinator at {address} (initialization_timeout_s {timeout_s:g})"
JOINING_RE = re.compile(r"^joining the coordinator at (?P<address>\S+) \(initialization_timeout_s "
                        r"(?P<timeout_s>[0-9.]+)\)$")
JOINED_RE = re.compile(r"^process \d+/\d+ joined ")
INIT_FAILED_FORMAT = "podlaunch-init-failed: {error}"
EXIT_INIT = 4
# Bad data found reading batches (worker.data.sources.DataError: file, row, column): not retried
EXIT_DATA = 5

# The worker's last line after a complete run. A process that exits 0 without it
# (and without a progress line of its last step) ended early: the launcher counts
# that as a failure, not a success (its peers would wait for it in a collective).
DONE_LINE = "done"


def is_finished(line: str, progress: "Progress | None | bool" = False) -> bool:
    """Whether ``line`` says training is complete (``DONE_LINE``, step N/N); ``progress``:
    its ``parse_progress`` if the caller has it (False: parsed here)."""
    progress = parse_progress(line) if progress is False else progress
    return line == DONE_LINE or (progress is not None and progress.step >= progress.num_steps)


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
    match = PROGRESS_RE.match(line) if line.startswith("step ") else None  # every line is asked
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
    match = STEP_RE.match(line) if line.startswith(_STEP_HEADS) else None
    if match is None:
        return None
    return int(match.group("done") or match.group("failed") or match.group("beat"))


def parse_seconds(pattern: re.Pattern, line: str):
    """``(step, seconds)`` of a line ``pattern`` (``RESUMED_RE``, ``CHECKPOINT_RE``) matches, or None."""
    match = pattern.match(line)
    return (int(match["step"]), float(match["seconds"] or 0.0)) if match else None


# host:port, IPv6 bracketed: built and parsed in one place (worker.contract.address)
from worker.contract.address import host_port, split_host_port  # noqa: E402,F401


# A run directory's checkpoints: <run_dir>/CHECKPOINTS_DIR/step-NNNNNNN/, each
# complete once it has that name (worker.recovery.checkpoint renames it into place).
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_DIR_RE = re.compile(r"^step-(\d{7,})$")


def checkpoints_in(names) -> list:
    """``(step, name)`` of the checkpoint directories among ``names``, oldest first."""
    return sorted((int(m.group(1)), name) for name in names if (m := CHECKPOINT_DIR_RE.match(name)))


def is_checkpoint_saved(line: str) -> bool:
    """Whether ``line`` is process 0's ``CHECKPOINT_FORMAT`` line."""
    return CHECKPOINT_RE.match(line) is not None


def is_failure(line: str) -> bool:
    """Whether ``line`` is a worker's own ``FAILED_FORMAT`` report (it names the exact step)."""
    return line.startswith(FAILED_PREFIX)


def parse_failed_time(line: str):
    """The host time a ``FAILED_TIME_FORMAT`` line reports, or None for any other line."""
    match = FAILED_TIME_RE.match(line)
    return float(match.group("at")) if match else None


# What a worker's error says when a peer died under it (a cascade, not a cause):
# gloo's and the coordination service's words, as JAX 0.9-0.12 print them.
PEER_LOSS_MARKERS = (
    "Gloo all-reduce failed", "Gloo all-gather failed", "Gloo broadcast failed",
    "Connection closed by peer", "Connection reset by peer",
    "coordination service has stopped", "Coordination service", "heartbeat timeout",
    "Terminating process because the JAX distributed service detected fatal errors",
)


def is_peer_loss(line: str) -> bool:
    """Whether a worker's output ``line`` says it failed because a peer went away."""
    return any(marker in line for marker in PEER_LOSS_MARKERS)


def is_heartbeat(line: str) -> bool:
    """Whether ``line`` is a heartbeat (progress for the watchdog, noise for people)."""
    return line.startswith(HEARTBEAT_PREFIX)


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


# ContractError and the typed-field checks (Identity here, the job's sections in worker.contract.job)
from worker.contract.fields import (ContractError, allowed_types, check_fields, describe_value,  # noqa: E402,F401
                           expected_type, hints_of, type_ok)


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
      compilation_cache_dir: JAX's persistent compilation cache directory as this
        process sees it; None means ``<run_dir>/compilation-cache``.
      local_device_ids: this process's device indices on its node (Slurm GPU steps), or None.
      rendezvous: ``"stdin"``: the coordinator address comes on stdin (``RENDEZVOUS``), or None.

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
    compilation_cache_dir: str | None = None
    local_device_ids: tuple[int, ...] | None = None
    rendezvous: str | None = None

    def __post_init__(self):
        check_fields(self)
        if self.rendezvous not in (None, "stdin"):
            raise ContractError(f"rendezvous is {self.rendezvous!r}, expected 'stdin' or unset")
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

        The optional ones are set only when they differ from their defaults: the
        launcher's restart loop and the tpu backend add them per attempt and per host.
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
        if self.compilation_cache_dir is not None:
            env[COMPILATION_CACHE_DIR] = self.compilation_cache_dir
        if self.local_device_ids is not None:
            env[LOCAL_DEVICE_IDS] = ",".join(map(str, self.local_device_ids))
        if self.rendezvous is not None:
            env[RENDEZVOUS] = self.rendezvous
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
        ids_text = environ.get(LOCAL_DEVICE_IDS) or None
        try:
            ids = None if ids_text is None else tuple(int(i) for i in ids_text.split(","))
        except ValueError:
            raise ContractError(f"malformed identity in the environment: {LOCAL_DEVICE_IDS}="
                                f"{ids_text!r}, expected comma-separated integers") from None
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
            compilation_cache_dir=environ.get(COMPILATION_CACHE_DIR) or None,
            local_device_ids=ids,
            rendezvous=environ.get(RENDEZVOUS) or None,
        )
