"""A detached ssh run whose supervisor is SIGKILLed loses nothing: its workers train on, their
output kept in a file on each host, and ``launch attach`` takes the very same processes back
(the wrappers proven on their hosts), reads what they printed meanwhile from the journaled
offset, and the run ends as it would have without the interruption. Real sshd hosts
(tests/harness/sshenv.py), real JAX workers; every wait polls a condition against a deadline."""

from __future__ import annotations

import pytest

from harness.adopted import PACED_0, STEPS_ARGS, assert_as_uninterrupted, kill_and_take_back
from harness import detached
from harness.runs import remote_run_dir, ssh_cluster

pytestmark = pytest.mark.slow
supervisors = detached.supervisors  # a fixture: every supervisor and worker gone at the end


def test_a_killed_ssh_supervisor_is_taken_back_by_attach_and_the_run_ends_as_uninterrupted(
        tmp_path, two_ssh_hosts, supervisors, reference_params):
    run_dir = tmp_path / "run"
    started = detached.launch("jobs/linear.yaml", "--cluster", ssh_cluster(tmp_path, two_ssh_hosts),
                              "--set", "cluster.devices_per_process=2", *STEPS_ARGS, *PACED_0,
                              "--run-dir", str(run_dir), "--detach", timeout_s=300)
    assert started.returncode == 0, started.stdout + started.stderr
    remote = [str(remote_run_dir(tmp_path / f"host{i}", run_dir)) for i in range(2)]
    out = kill_and_take_back(run_dir, remote, supervisors)
    assert "OK: 2 processes succeeded" in out, out[-3000:]
    # 2 hosts x 1 process x 2 devices: a local 2 x 2 run's params
    assert_as_uninterrupted(run_dir, reference_params(*STEPS_ARGS), 2)
