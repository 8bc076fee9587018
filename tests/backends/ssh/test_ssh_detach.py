"""A detached run over ssh: the supervisor leaves the terminal, ``launch stop`` returns only
once no process of the run is left on any host. Real sshd hosts (tests/harness/sshenv.py)."""

from __future__ import annotations

import json

import pytest

from harness.detached import launch, step, supervisor, supervisors, until  # noqa: F401 (a fixture)
from harness.helpers import PACED, pids_with_env
from harness.runs import remote_run_dir, ssh_cluster

pytestmark = pytest.mark.slow


def test_stop_of_a_detached_ssh_run_returns_once_no_host_has_a_process(tmp_path, two_ssh_hosts,
                                                                        supervisors):
    run_dir = tmp_path / "run"
    started = launch("jobs/linear.yaml", "--cluster", ssh_cluster(tmp_path, two_ssh_hosts),
                     "--set", "train.num_steps=1000000", "--set", "logging.log_every_steps=20",
                     "--set", "cluster.devices_per_process=1", *PACED, "--run-dir", str(run_dir),
                     "--detach", timeout_s=300)
    assert started.returncode == 0, started.stdout + started.stderr
    supervisors.append(supervisor(run_dir))
    remote = [str(remote_run_dir(tmp_path / f"host{i}", run_dir)) for i in range(2)]
    until(lambda: step(run_dir) >= 40, "run.json's step", timeout_s=180)
    assert all(pids_with_env("PODLAUNCH_RUN_DIR", d) for d in remote)  # training on both hosts
    assert launch("wait", str(run_dir), "--timeout", "0.5").returncode == 124
    # its journal says that an ssh run's processes can be taken back (launch attach of it,
    # its supervisor killed: tests/backends/ssh/test_ssh_adopt.py), each by its host
    kept = json.loads((run_dir / "supervisor.json").read_text())
    assert (kept["backend"], kept["adopts"]) == ("ssh", True), kept
    assert sorted(w["host"] for w in kept["workers"]) == sorted(two_ssh_hosts.hosts), kept
    stopped = launch("stop", str(run_dir), timeout_s=300)
    left = {d: pids_with_env("PODLAUNCH_RUN_DIR", d) for d in remote}  # at once: no waiting
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not any(left.values()), left
    assert launch("wait", str(run_dir)).returncode == 130
    assert "interrupted" in launch("logs", str(run_dir)).stdout
    assert not (run_dir / "supervisor.json").exists()
