"""A program job's process that says which GPUs it was given, then exits 0 (no JAX: the
machine that runs tests/backends/slurm/test_slurm_gpu.py has no GPU).

It prints one line, ``gpu-report {json}``: what decides its GPUs (Slurm's
``CUDA_VISIBLE_DEVICES`` and ``SLURM_STEP_GPUS`` for its step, ``CUDA_DEVICE_ORDER``,
podlaunch's ``PODLAUNCH_LOCAL_DEVICE_IDS``, which ``program.initialize()`` passes to
``jax.distributed.initialize`` as ``local_device_ids``), who it is (process id, node, job),
and the ``SLURM_GPUS_*`` it sees; ``gpus``: the GPUs it would train on, the entries of
``CUDA_VISIBLE_DEVICES`` at its ``local_device_ids`` (None where one is missing: JAX would
refuse to start).
"""

import json
import os

KEYS = ("PODLAUNCH_PROCESS_ID", "SLURMD_NODENAME", "SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER", "SLURM_STEP_GPUS", "PODLAUNCH_LOCAL_DEVICE_IDS",
        "SLURM_GPUS_PER_TASK", "SLURM_GPUS_PER_NODE", "SLURM_TRES_PER_TASK")

seen = {key: os.environ.get(key) for key in KEYS}
visible = (seen["CUDA_VISIBLE_DEVICES"] or "").split(",")
ids = [int(i) for i in (seen["PODLAUNCH_LOCAL_DEVICE_IDS"] or "").split(",") if i]
seen["gpus"] = [visible[i] if i < len(visible) and visible[i] else None for i in ids]
print("gpu-report " + json.dumps(seen), flush=True)
