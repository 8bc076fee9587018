"""What the fault tests of every layer share: a fault on attempt 0, the final params of a
run and their comparison, and a cluster file for sshd hosts."""

from __future__ import annotations

import os
import sys

import numpy as np
import yaml

from harness.helpers import PROGRAMS, REPO


def fault(mode: str, step: int, process_id: int = 1) -> tuple:
    """``--set`` arguments: process ``process_id`` misbehaves (``mode``, faulty_task's) after
    step ``step`` of attempt 0 only (``faulty_task:first_attempt``)."""
    return ("--set", "task.name=faulty_task:first_attempt",
            "--set", f"task.args.crash_at_step={step}", "--set", f"task.args.crash_process_id={process_id}",
            "--set", f"task.args.mode={mode}")


# A run a test can ask things of while it goes: process 0 sleeps 50 ms after each step (the
# others wait for it in the all-reduce), with jobs/linear.yaml's params (faulty_task's math)
SLOW_PROCESS_0 = ("--set", "task.name=faulty_task:make", "--set", "task.args.sleep_s=0.05",
                  "--set", "task.args.slow_process_id=0")


# A run that loses a host (or a node) mid-run, in the tests of every backend that can: 1,024
# shuffled rows (4 batches of 256 per epoch, so a resume from step 10 or 15 is in the middle of
# an epoch), a checkpoint every 5 steps, process 0 sleeping on attempt 0 only (so that the test
# can act while it trains)
STEPS_LOST = 40
LOSES_A_HOST = ("--set", f"train.num_steps={STEPS_LOST}", "--set", "data.num_examples=1024",
                "--set", "data.shuffle=true", "--set", "logging.log_every_steps=5",
                "--set", "checkpoint.every_steps=5", "--set", "restarts.backoff_s=0.2",
                "--set", "task.name=faulty_task:make", "--set", "task.args.sleep_s=0.1",
                "--set", "task.args.slow_process_id=0", "--set", "task.args.slow_attempt=0")


def remote_run_dir(workdir, run_dir, job: str = "linear"):
    """A host's copy of the run: ``<workdir>/runs/<job>/<name>`` as podlaunch names it
    (``plan.remote_run_name``: the local name and a hash of its path), a ``Path``."""
    from pathlib import Path

    from launcher.plan import remote_run_name
    return Path(workdir) / "runs" / job / remote_run_name(str(run_dir))


def params(run_dir) -> dict:
    """A run's final params (``params.npz``): name -> array."""
    with np.load(os.path.join(run_dir, "params.npz")) as f:
        return {k: f[k] for k in f.files}


def assert_same_params(got: dict, want: dict) -> None:
    """Equal names, and values within float32 rounding (rtol 1e-6)."""
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=0)


def ssh_cluster(tmp_path, ssh_hosts) -> str:
    """A cluster file for the sshd hosts (a workdir each under ``tmp_path``); its path."""
    cluster = {
        "backend": "ssh", "ssh_config_file": ssh_hosts.ssh_config, "python": sys.executable,
        "hosts": [{"host": h, "workdir": str(tmp_path / f"host{i}")} for i, h in enumerate(ssh_hosts.hosts)],
        "env": {"PYTHONPATH": os.pathsep.join([PROGRAMS, REPO])},
        "grace_s": 2, "keepalive_interval_s": 1, "keepalive_timeout_s": 4,
    }
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    return str(tmp_path / "cluster.yaml")


def agreed_step(run_dir, num_processes: int, saying: str = "") -> int:
    """The step attempt 0's processes stopped after for a notice: each process's log says
    it once (``worker.recovery.notice``), with ``saying`` after it when given, and all say the same."""
    import re

    from launcher import logtimes

    stops = []
    for i in range(num_processes):
        text = logtimes.read_text(os.path.join(run_dir, "logs", f"process-{i:03d}.log"))
        stops.append(re.findall(r"^preemption notice from process \d+: every process stops "
                                rf"after step (\d+){re.escape(saying)}{'$' if saying else ''}", text, re.M))
    assert all(len(found) == 1 for found in stops) and len({s[0] for s in stops}) == 1, stops
    return int(stops[0][0])


def assert_one_agreed_stop(run_dir, num_processes: int, noticed_at: int) -> int:
    """Attempt 0 of ``run_dir`` stopped for a preemption notice that came after step
    ``noticed_at`` (``worker.recovery.notice``): every process says it stops after one step S >= it,
    process 0 saved S, attempt 1 resumed from S on every process, and the ledger counts no
    step trained twice. Fails on a save by process 0 alone (the others say nothing, or
    another step) and on a resume that ignores it. Returns S."""
    import json
    import re

    from launcher import logtimes

    logs = os.path.join(run_dir, "logs")
    step = agreed_step(run_dir, num_processes)
    assert step >= noticed_at, (step, noticed_at)
    text = logtimes.read_text(os.path.join(logs, "process-000.log"))
    assert re.search(rf"^checkpoint of step {step} saved in [0-9.]+ s: ", text, re.M), text[-3000:]
    for i in range(num_processes):
        again = logtimes.read_text(os.path.join(logs, "attempt-1", f"process-{i:03d}.log"))
        assert re.search(rf"^resumed from the checkpoint of step {step} \(attempt 1\)", again, re.M), again[-2000:]
    with open(os.path.join(run_dir, "ledger.json")) as f:
        ledger = json.load(f)
    assert ledger["attempts"][1]["resumed_step"] == step and ledger["run"]["steps_again"] == 0, ledger
    return step
