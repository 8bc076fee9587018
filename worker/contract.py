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
  PODLAUNCH_RUN_DIR              directory for TensorBoard events and final params
                                 (written by process 0 only).

Progress lines: a worker prints ``PROGRESS_FORMAT`` lines at every logged step
and ``FAILED_FORMAT`` when it dies of an exception; the launcher parses both
with ``STEP_RE`` to know the step each process reached.
"""

import re

COORDINATOR_ADDRESS = "PODLAUNCH_COORDINATOR_ADDRESS"
NUM_PROCESSES = "PODLAUNCH_NUM_PROCESSES"
PROCESS_ID = "PODLAUNCH_PROCESS_ID"
LOCAL_DEVICE_COUNT = "PODLAUNCH_LOCAL_DEVICE_COUNT"
PLATFORM = "PODLAUNCH_PLATFORM"
JOB = "PODLAUNCH_JOB"
RUN_DIR = "PODLAUNCH_RUN_DIR"

ALL = (COORDINATOR_ADDRESS, NUM_PROCESSES, PROCESS_ID, LOCAL_DEVICE_COUNT,
       PLATFORM, JOB, RUN_DIR)

# "step 40/100 loss 0.012345 | 812.3 steps/s"
PROGRESS_FORMAT = "step {step}/{num_steps} loss {loss:.6g} | {steps_per_s:.1f} steps/s"
FAILED_FORMAT = "failed at step {step}: {error}"
STEP_RE = re.compile(r"^(?:step (?P<done>\d+)/\d+ |failed at step (?P<failed>\d+):)")

# Exit code a worker uses when its own checks (identity, devices) fail.
EXIT_MISMATCH = 3


def parse_step(line: str):
    """Return the step number a progress or failure line reports, or None."""
    match = STEP_RE.match(line)
    if match is None:
        return None
    return int(match.group("done") or match.group("failed"))

# Optional: JAX's cluster_detection_method for jax.distributed.initialize.
# "deactivate" (the default): the launcher's process_id and num_processes are
# used as given; "gcetpu": JAX reads them from the TPU VM's metadata and the
# worker checks them against the plan.
CLUSTER_DETECTION_METHOD = "PODLAUNCH_CLUSTER_DETECTION_METHOD"
