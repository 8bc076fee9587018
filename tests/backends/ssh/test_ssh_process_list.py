"""Over ssh too, a run's process list is readable (issue 50, item 5): each host's wrapper is
started from a file of its source written by the start script, not with the source on its
command line, and each worker's command line names its job, run and process id. Every
"host" is this machine, so the process table holds every remote process."""

from __future__ import annotations

import os

import pytest

from harness.helpers import NO_RESTARTS, PACED, launched
from harness.runs import ssh_cluster

LONGEST = 500


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace").strip()


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


@pytest.mark.slow
def test_hosts_show_short_command_lines_naming_each_worker(tmp_path, two_ssh_hosts):
    cluster = ssh_cluster(tmp_path, two_ssh_hosts)
    run_dir = tmp_path / "run"
    with launched("jobs/linear.yaml", "--cluster", cluster, "--run-dir", str(run_dir),
                  "--set", "train.num_steps=1000000", "--set", "cluster.devices_per_process=1",
                  *PACED, *NO_RESTARTS) as out:
        out.wait_for(r"^\[p0 [^\]]+\] step \d+/", 120)
        table, workers, wrappers = {}, {}, {}
        for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
            try:
                line = _cmdline(pid)
                if " -m worker " in line:
                    parent = _parent(pid)
                    wrapper = _cmdline(parent)
                    if str(tmp_path) in wrapper:  # this run's: the hosts' workdirs are there
                        workers[pid], wrappers[parent] = line, wrapper
            except OSError:
                continue
            if str(tmp_path) in line:  # the launcher, the hosts' shells and wrappers
                table[pid] = line
        out.proc.terminate()
        out.finish(60)
    assert sorted(line.split(" -m worker ", 1)[1] for line in workers.values()) == [
        f"--job linear --run run --process-id {i}" for i in (0, 1)], table
    assert len(wrappers) == 2 and all("/wrapper-" in line for line in wrappers.values()), wrappers
    for line in [*table.values(), *workers.values()]:
        assert len(line) <= LONGEST, line[:300]
