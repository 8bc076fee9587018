"""Profiles over real sshd hosts: each process traces on its own host, the traces come back
into the run directory on this machine (``launcher.backends.ssh.fetches.trace_fetcher``),
``launch profile`` reaches every host over its SSH channel, and ``launch tensorboard`` shows
every process's trace."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from harness.helpers import LAUNCH, REPO, env_for_tests, launched
from harness.runs import SLOW_PROCESS_0, assert_same_params, params, remote_run_dir, ssh_cluster
from harness.served import check_served
from worker.contract import profiling

SLOW = (*SLOW_PROCESS_0, "--set", "checkpoint.local_every_steps=0")  # reference_params()'s params
# a live request must land before the run ends: `launch profile` itself took more than the 70
# steps' 3.5 s left at 0.05 s a step under two CI runs at once (asked steps 98-100, too late)
SLOWER = ("--set", "task.args.sleep_s=0.2")


@pytest.mark.slow
def test_traces_from_every_host_come_back_and_a_live_request_reaches_each(tmp_path, two_ssh_hosts,
                                                                          reference_params):
    run_dir = tmp_path / "run"
    with launched("jobs/linear.yaml", "--cluster", ssh_cluster(tmp_path, two_ssh_hosts), *SLOW,
                  *SLOWER, "--set", "profile.start_step=20", "--set", "profile.num_steps=6",
                  "--run-dir", str(run_dir)) as out:
        out.wait_for(r"profile steps_20-25: 2 traces in ", 120)
        out.wait_for(r"\[p0 [^]]+\] step 30/100", 120)
        asked = subprocess.run(LAUNCH + ["profile", str(run_dir), "--steps", "3"], cwd=REPO,
                               env=env_for_tests(), capture_output=True, text=True, timeout=90)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        live = re.search(r"profile (steps_\d+-\d+): steps ", asked.stdout)[1]
        code, text = out.finish(300)
    assert code == 0, text[-3000:]
    for session in ("steps_20-25", live):
        for p in (0, 1):  # each written on its own host, copied here
            local = profiling.trace_path(str(run_dir), session, p)
            remote = profiling.trace_path(str(remote_run_dir(tmp_path / f"host{p}", run_dir)),
                                          session, p)
            assert os.path.getsize(local) > 10000 and os.path.exists(remote), (local, remote)
            with open(local, "rb") as mine, open(remote, "rb") as theirs:
                assert mine.read() == theirs.read()
    assert_same_params(params(run_dir), reference_params())
    check_served(run_dir, "steps_20-25", [0, 1], 20)
