"""Hosts given as IPv6 addresses (issue 25, item 1): host 0 on ``::1`` over a real sshd.

The coordinator address reaches JAX bracketed (``[::1]:PORT``); unbracketed, every process
waited out its join timeout (jax #33251). Host 1 is an IPv4 loopback address of the same
machine, so the run also mixes the two families.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import yaml

from harness import sshenv
from harness.helpers import REPO, PROGRAMS, launch
from worker.contract.address import host_port, split_host_port

STEPS = ("--set", "train.num_steps=20", "--set", "cluster.devices_per_process=1")


def test_host_port_brackets_ipv6_and_splits_both_forms():
    assert host_port("::1", 8476) == "[::1]:8476"
    assert host_port("[fe80::1]", 1) == "[fe80::1]:1"
    assert host_port("10.0.0.2", 8476) == "10.0.0.2:8476"
    assert split_host_port("[::1]:8476") == ("::1", 8476)
    assert split_host_port("n1:80") == ("n1", 80)
    for bad in ("::1:8476", "host", "host:", "[::1]:x"):
        with pytest.raises(ValueError):
            split_host_port(bad)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with sshenv.hosts_or_skip(tmp_path_factory.mktemp("ssh6"), 2, addresses={0: "::1"}) as env:
        yield env


def _params(run_dir) -> list:
    with np.load(os.path.join(run_dir, "params.npz")) as f:
        return [f[k] for k in sorted(f.files)]


@pytest.mark.slow
def test_a_job_whose_host_0_is_ipv6_trains_to_the_local_params(tmp_path, hosts):
    cluster = {"backend": "ssh", "ssh_config_file": hosts.ssh_config, "python": sys.executable,
               "hosts": [{"host": h, "workdir": str(tmp_path / f"host{i}")}
                         for i, h in enumerate(hosts.hosts)],
               "env": {"PYTHONPATH": os.pathsep.join([PROGRAMS, REPO])}, "grace_s": 2}
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    dry = launch("jobs/linear.yaml", "--cluster", str(tmp_path / "cluster.yaml"), *STEPS, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "coordinator_address [::1]:" in dry.stdout, dry.stdout
    ssh_run, local_run = tmp_path / "ssh-run", tmp_path / "local-run"
    done = launch("jobs/linear.yaml", "--cluster", str(tmp_path / "cluster.yaml"), *STEPS,
                  "--run-dir", str(ssh_run), timeout_s=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "joining the coordinator at [::1]:" in out and "OK: 2 processes succeeded" in out, out
    local = launch("jobs/linear.yaml", *STEPS, "--run-dir", str(local_run))
    assert local.returncode == 0, local.stdout + local.stderr
    for got, want in zip(_params(ssh_run), _params(local_run)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
