"""The launcher-worker contract: the worker's identity, its exit codes and its run directory's
checkpoints.

The package is the one place where what crosses the launcher-worker boundary is written (its
modules: ``job``, ``sections``, ``signals``, ``notice``, ``profiling``, ``metrics``, ``causes``...);
this one holds the identity; ``wire`` the lines a worker prints. Standard library only: the launcher is instant.

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

The lines a worker prints for its launcher (progress, heartbeats, failures, joining...) are
typed in ``worker.contract.wire``, each knowing its text, and read through its one ``parse``.
"""

from __future__ import annotations

import dataclasses
import re
import typing

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
EXIT_MISMATCH = 3  # the exit code of a worker whose own checks (identity, devices) failed

# The slurm backend starts every process at once, without a probe step before them
# (bench/bench_slurm.py): with RENDEZVOUS=stdin a worker first prints one line,
# ``wire.Facts``: JSON of ``worker.contract.nodefacts.facts`` (versions; process 0 also the
# coordinator port of its address, 0 for any free one, checked free on its node),
# then imports jax while the launcher compares every node's facts, and then reads
# the coordinator's ``host:port`` as one line on stdin. End of input instead: the
# launcher refused the start; the worker exits EXIT_MISMATCH.
RENDEZVOUS = "PODLAUNCH_RENDEZVOUS"

# A process that dies between ``wire.Joining`` and ``wire.Joined`` with a Python error exits
# EXIT_INIT after a ``wire.InitFailed`` line: it failed to join.
EXIT_INIT = 4
# Bad data found reading batches (worker.data.sources.DataError: file, row, column): not retried
EXIT_DATA = 5

# A run directory's checkpoints: <run_dir>/CHECKPOINTS_DIR/step-NNNNNNN/, each
# complete once it has that name (worker.recovery.checkpoint renames it into place).
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_DIR_RE = re.compile(r"^step-(\d{7,})$")


def checkpoints_in(names) -> list:
    """``(step, name)`` of the checkpoint directories among ``names``, oldest first."""
    return sorted((int(m.group(1)), name) for name in names if (m := CHECKPOINT_DIR_RE.match(name)))


# Optional: JAX's cluster_detection_method for jax.distributed.initialize.
# "deactivate" (the default): the launcher's process_id and num_processes are
# used as given; "gcetpu": JAX reads them from the TPU VM's metadata and the
# worker checks them against the plan.
CLUSTER_DETECTION_METHOD = "PODLAUNCH_CLUSTER_DETECTION_METHOD"


# ContractError and the typed-field checks (Identity here, the job's sections in worker.contract.job)
from worker.contract.fields import ContractError, check_fields  # noqa: E402


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
