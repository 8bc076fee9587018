"""The launcher-worker contract: environment variable names and progress lines.

This module is the single definition of how the launcher tells a worker who it
is and how a worker reports progress back. It imports nothing heavy (no jax,
no numpy), so the launcher can import it and stay instant.

Environment (all values are strings):
  PODLAUNCH_COORDINATOR_ADDRESS  ``host:port`` of JAX's coordination service,
                                 identical for every process.
  PODLAUNCH_NUM_PROCESSES        ``num_processes`` of ``jax.distributed.initialize``.
  PODLAUNCH_PROCESS_ID           this process's ``process_id``, 0 .. num_processes-1.
  PODLAUNCH_LOCAL_DEVICE_COUNT   devices the plan expects this process to see.
  PODLAUNCH_PLATFORM             platform the plan expects (``cpu``, ``gpu``, ``tpu``).
  PODLAUNCH_JOB                  path of the resolved job (JSON) the worker runs.
  PODLAUNCH_RUN_DIR              directory for TensorBoard events, checkpoints and
                                 final params (written by process 0 only).

Optional (set by the launcher's restart loop and ``--resume``):
  PODLAUNCH_ATTEMPT              0 for the first attempt, n for the n-th restart.
  PODLAUNCH_RESUME               "1": process 0 restores the latest complete
                                 checkpoint of its run directory and broadcasts it.

Progress lines: a worker prints ``PROGRESS_FORMAT`` lines at every logged step,
``HEARTBEAT_FORMAT`` lines at most every ``heartbeat_interval_s`` between them
(for the launcher's stall watchdog; the launcher does not echo them), and
``FAILED_FORMAT`` when it dies of an exception; the launcher parses all three
with ``parse_step`` to know the step each process reached, and when.
"""

import re
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
