"""A test task for the ssh backend: the linear task, and each process records its environment.

``task.name: ssh_task:record_env`` with ``task.args: {names: [...], out_dir: DIR}``
writes ``DIR/process-<id>.json`` mapping each name to its value as the worker
saw it (null when unset), so tests can check values crossed the remote shell intact.
"""

from __future__ import annotations

import json
import os

from worker import tasks


def record_env(names: list, out_dir: str) -> tasks.Task:
    process_id = os.environ["PODLAUNCH_PROCESS_ID"]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"process-{process_id}.json"), "w", encoding="utf-8") as f:
        json.dump({name: os.environ.get(name) for name in names}, f)
    return tasks.Task(init_params=tasks.init_linear, loss_fn=tasks.mse)
