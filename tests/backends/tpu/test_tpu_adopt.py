"""A detached tpu run (a slice of two TPU VM hosts: fake gcloud, real sshd) whose supervisor is
SIGKILLed mid-run: ``launch attach`` discovers the slice again, takes the very same processes
back over SSH, and the run ends as it would have without the interruption (the ssh backend's
test, tests/backends/ssh/test_ssh_adopt.py, on the tpu backend's session)."""

from __future__ import annotations

import os
import subprocess

import pytest

from harness import detached, fake_gcloud
from harness.adopted import PACED_0, STEPS_ARGS, assert_as_uninterrupted, kill_and_take_back
from harness.helpers import LAUNCH, REPO, env_for_tests
from harness.runs import remote_run_dir

pytestmark = pytest.mark.slow
supervisors = detached.supervisors  # a fixture: every supervisor and worker gone at the end


def test_a_killed_tpu_supervisor_is_taken_back_by_attach_and_the_run_ends_as_uninterrupted(
        tmp_path, ssh_hosts, supervisors, reference_params):
    from test_tpu import TWO_SLICES, write_cluster

    bin_dir = tmp_path / "bin"
    fake_gcloud.install(bin_dir, {"slice-a": fake_gcloud.node("v4-16", TWO_SLICES["slice-a"])})
    env = env_for_tests(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    run_dir = tmp_path / "run"
    # coordinator_port 0: a free one (jax's default, 8482 on 127.0.0.2, is test_tpu.py's)
    cluster = write_cluster(tmp_path, ssh_hosts, slices=["slice-a"], coordinator_port=0)
    started = subprocess.run(
        LAUNCH + ["jobs/linear.yaml", "--cluster", cluster,
                  *STEPS_ARGS, *PACED_0, "--run-dir", str(run_dir), "--detach"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert started.returncode == 0, started.stdout + started.stderr
    # each loopback "host" works in its own directory, named for its address (write_cluster)
    remote = [str(remote_run_dir(tmp_path / "remote" / f"h-{ip}", run_dir))
              for ip in TWO_SLICES["slice-a"]]
    out = kill_and_take_back(run_dir, remote, supervisors, env)
    assert "OK: 2 processes succeeded" in out, out[-3000:]
    assert_as_uninterrupted(run_dir, reference_params(*STEPS_ARGS), 2)
