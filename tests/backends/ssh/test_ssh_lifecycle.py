"""Issue 12, items 8, 9 and 13, against real sshd hosts and real processes.

* A coordinator address some host cannot reach (item 8): host 0 on this machine's
  loopback, the other hosts in their own network namespaces (tests/harness/netns.py: their
  own loopback, reached over a bridge, like other machines).
* Who stopped (item 9): one remote worker SIGSTOPped, each process_id in turn.
* sshd's MaxSessions, and a start that fails on one host (item 13).

After every fault, every host's process table is read (all hosts are this machine's
processes, whatever network they see): nothing of the run is left, nor a check's listener.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time

import pytest
import yaml

from harness import netns
from harness import sshenv
from harness.runs import remote_run_dir
from launcher import proctl
from harness.helpers import NO_RESTARTS, REPO, PROGRAMS, launch, pids_with_env

SMALL = ("--set", "cluster.devices_per_process=1", "--set", "train.global_batch_size=24",
         "--set", "data.num_examples=24")


def write_cluster(path, ssh_env, which, **settings) -> str:
    """A cluster file of ``ssh_env``'s hosts ``which`` (indices, in this order)."""
    cluster = {
        "backend": "ssh",
        "hosts": [{"host": ssh_env.hosts[i], "workdir": str(path / f"host{i}")} for i in which],
        "ssh_config_file": ssh_env.ssh_config,
        "python": sys.executable,
        "env": {"PYTHONPATH": os.pathsep.join([PROGRAMS, REPO])},
        "grace_s": 2, "keepalive_interval_s": 1, "keepalive_timeout_s": 4,
    }
    cluster.update(settings)
    file = path / "cluster.yaml"
    file.write_text(yaml.safe_dump(cluster))
    return str(file)


def _ours(pid: int) -> bool:
    """Whether ``pid`` came through one of this test process's sshds (its SSH_CONNECTION names
    that server port), or was orphaned: a probe of another test process's hosts is not ours."""
    for item in proctl.environ(pid):
        if item.startswith(b"SSH_CONNECTION="):
            port = item.rsplit(b" ", 1)[-1]
            return port.isdigit() and int(port) in sshenv.STARTED_PORTS
    return True  # not started over ssh at all: count it


def leftovers(path, run_dir, num_hosts: int) -> dict:
    """Every host's process table, read: {host index: pids of this run there}, plus the
    reach check's listeners and probes under "reach"."""
    found = {i: pids for i in range(num_hosts) if (pids := pids_with_env(
        "PODLAUNCH_RUN_DIR", str(remote_run_dir(path / f"host{i}", run_dir))))}
    probes = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"podlaunch-reach " in f.read() and _ours(int(pid)):
                    probes.append(int(pid))
        except OSError:
            pass
    if probes:
        found["reach"] = probes
    return found


def summary_row(out: str, process_id: int) -> str:
    match = re.search(rf"^p{process_id} .*$", out, re.M)
    return match.group(0) if match else ""


# ---- item 8: a coordinator address some host cannot reach -------------------------
@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    """Host 0 on this machine's loopback (127.0.0.2); hosts 1 and 2 are other machines
    (network namespaces on a bridge)."""
    why = netns.available()
    if why is not None:
        if sshenv.in_ci():
            pytest.fail(f"CI=true and network namespaces cannot be made here: {why}", pytrace=False)
        pytest.skip(sshenv.UNAVAILABLE + why)
    with netns.Machines(2) as m:
        with sshenv.hosts_or_skip(tmp_path_factory.mktemp("netns"), 3,
                                  namespaces=m.namespaces(first_host=1)) as env:
            yield env


@pytest.mark.slow
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_loopback_host_0_with_other_machines_is_refused_before_anything_starts(
        tmp_path, machines, dry_run):
    run_dir = tmp_path / "run"
    cluster = write_cluster(tmp_path, machines, [0, 1, 2])
    started = time.monotonic()
    result = launch("jobs/linear.yaml", "--cluster", cluster, *SMALL, "--run-dir", str(run_dir),
                    *(["--dry-run"] if dry_run else []))
    elapsed_s = time.monotonic() - started
    err = result.stderr
    assert result.returncode == 2, result.stdout + err
    assert "Traceback" not in err
    line = next((x for x in err.splitlines() if "cluster.hosts[0]" in x), "")
    # file:line of host 0, its name and address, who cannot reach it and why, what to do
    assert re.match(rf"error: {re.escape(cluster)}:\d+: cluster\.hosts\[0\]: host 0 127\.0\.0\.2 serves the "
                    rf"coordinator at 127\.0\.0\.2:\d+, which 2 of 3 hosts cannot reach: ", line), err
    for i in (1, 2):
        assert f"{machines.hosts[i]} (p{i}): connection refused" in line, line
    assert "127.0.0.2 is a loopback address" in line and "not localhost" in line, line
    assert line.endswith("as Debian's 127.0.1.1 line does)"), line
    assert "launch: 1 problem in the input; nothing was started." in err
    assert "starting" not in result.stdout and not (run_dir / "logs").exists()
    assert elapsed_s < 60  # refused up front, not after JAX's initialization_timeout_s (60)
    assert not leftovers(tmp_path, run_dir, 3)


@pytest.mark.slow
def test_other_machines_that_reach_host_0_pass_the_check_and_train(tmp_path, machines):
    """Host 0 named by its address on the shared network, each machine's name resolving to
    its own address: every host reads the token back, and the run trains over gloo."""
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, machines, [1, 2]),
                    *SMALL, "--set", "train.num_steps=5", "--run-dir", str(run_dir), "--show", "all")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"coordinator {machines.hosts[1]}:" in result.stdout, result.stdout
    assert "could not check" not in result.stdout
    assert re.search(rf"^\[p1 {re.escape(machines.hosts[2])}\] step 5/5 loss", result.stdout, re.M)
    assert "OK: 2 processes succeeded" in result.stdout
    assert not leftovers(tmp_path, run_dir, 3)


@pytest.fixture(scope="module")
def loopback_named(tmp_path_factory, machines):
    """Two other machines whose name resolves to loopback there (Debian's 127.0.1.1 line)."""
    with netns.Machines(2, own_names=False, tag=1) as m:
        with sshenv.hosts_or_skip(tmp_path_factory.mktemp("netns-lo"), 2,
                                  namespaces=m.namespaces()) as env:
            yield env


@pytest.mark.slow
@pytest.mark.parametrize("dry_run", [False, True])
def test_machines_whose_names_resolve_to_loopback_are_refused_for_gloo(tmp_path, loopback_named,
                                                                        dry_run):
    """The same kind for the collectives: gloo gives its peers the address the host's name
    resolves to; loopback on other machines fails at the first step. Refused up front."""
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, loopback_named, [0, 1]),
                    *SMALL, "--run-dir", str(run_dir), *(["--dry-run"] if dry_run else []))
    err = result.stderr
    assert result.returncode == 2, result.stdout + err
    name = socket.gethostname()
    for i, host in enumerate(loopback_named.hosts):
        assert re.search(rf"cluster\.hosts\[0\]: {re.escape(host)} \(p{i}\): its name '{name}' "
                         rf"resolves to 127\.[\d.]+ there, a loopback address; gloo \(JAX's CPU "
                         rf"collectives\) gives its peers that address.* Map {name} to the host's "
                         rf"network address in its /etc/hosts", err), err
    assert "Traceback" not in err and not (run_dir / "logs").exists()
    assert not leftovers(tmp_path, run_dir, 2)


# ---- items 9 and 13: two hosts on this machine's loopback ----------------------------
@pytest.fixture
def hosts(two_ssh_hosts):
    """Two of the session's sshd hosts (tests/conftest.py), restored after the test
    (listening, MaxSessions 50)."""
    return two_ssh_hosts


@pytest.mark.slow
@pytest.mark.parametrize("mode, process_id", [("sigstop", 0), ("sigstop", 1), ("sigstop", 2),
                                              ("sigstop", 3), ("stall", 1)])
def test_the_sigstopped_remote_worker_is_named(tmp_path, hosts, mode, process_id):
    """2 hosts x 2 processes; one is SIGSTOPped at step 6. Its peers block behind it in the
    next all-reduce within milliseconds, so only the host's process state tells them apart:
    the summary must name the stopped one, for each process_id in turn. Every other
    process's stacks are read on its host before the kill; the stopped one is named as
    unreadable. ``stall``: process 1 sleeps in the task's own function instead, alive: its
    stacks, read over SSH, name that function."""
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, hosts, [0, 1],
                                                                  processes_per_host=2),
                    "--set", "cluster.devices_per_process=1", "--set", "train.num_steps=100000",
                    "--set", "logging.log_every_steps=1", "--set", "watchdog.stall_timeout_s=5",
                    "--set", "checkpoint.every_steps=0", "--set", "restarts.max_restarts=0",
                    "--set", "task.name=faulty_task:make", "--set", f"task.args.mode={mode}",
                    "--set", "task.args.crash_at_step=6",
                    "--set", f"task.args.crash_process_id={process_id}", "--run-dir", str(run_dir))
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    others = [p for p in range(4) if p != process_id]
    dumps = [run_dir / "logs" / f"process-00{p}.stacks.txt" for p in range(4)]
    if mode == "stall":  # alive: every process answers, and the hung one stands in its task
        assert re.search(r"^podlaunch: stacks \(stalled\): read 4 of 4 processes", out, re.M), out
        assert re.search(r"^stacks: p1 127\.0\.0\.\d( \(stalled\))? stands in on_step_end "
                         r"\(faulty_task\.py:\d+\)$", out, re.M), out
        assert all(d.exists() for d in dumps)
        assert not leftovers(tmp_path, run_dir, 2)
        return
    assert re.search(rf"^stacks: p{process_id} 127\.0\.0\.\d could not be read: it is stopped \(SIGSTOP",
                     out, re.M), out
    assert [d.exists() for d in dumps] == [p != process_id for p in range(4)], out
    assert all(f"p{p} 127.0.0." in dumps[p].read_text().splitlines()[0] for p in others)
    assert re.search(rf"^podlaunch: p{process_id} 127\.0\.0\.\d stalled: no step progress for \d+\.\d s \(the process "
                     r"is stopped, e\.g\. by SIGSTOP\) \(stall_timeout_s 5\); last step seen", out, re.M), out
    assert re.search(rf"^p{process_id} +127\.0\.0\.\d +failed \(first\) +stalled: ",
                     summary_row(out, process_id)), out
    assert not leftovers(tmp_path, run_dir, 2)  # the stopped one too (SIGKILL ends it)


@pytest.mark.slow
def test_more_processes_than_max_sessions_run(tmp_path, hosts):
    """MaxSessions 2 on both hosts and 3 processes each: SFTP and the first worker fill the
    first connection, the others go on more connections."""
    for i in range(2):
        hosts.limit_sessions(i, 2)
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, hosts, [0, 1],
                                                                  processes_per_host=3),
                    *SMALL, "--set", "train.num_steps=5", "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: 6 processes succeeded" in result.stdout
    for i in range(2):  # the limit was met, and more connections were opened
        log = hosts.log_file(i).read_text()
        assert "no more sessions" in log, hosts.log_tail(i)  # sshd refused a channel
    assert not leftovers(tmp_path, run_dir, 2)


@pytest.mark.slow
def test_a_crash_under_max_sessions_stops_every_process(tmp_path, hosts):
    """MaxSessions 2, 3 processes per host, p4 SIGKILLed at step 3: the teardown signals five
    process groups over connections already full of workers, so it needs more of them."""
    for i in range(2):
        hosts.limit_sessions(i, 2)
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, hosts, [0, 1],
                                                                  processes_per_host=3),
                    *SMALL, "--set", "train.num_steps=100000", "--set", "logging.log_every_steps=1",
                    "--set", "checkpoint.every_steps=0", "--set", "task.name=faulty_task:make",
                    "--set", "task.args.mode=sigkill", "--set", "task.args.crash_at_step=3", *NO_RESTARTS,
                    "--set", "task.args.crash_process_id=4", "--run-dir", str(run_dir))
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert re.search(r"^FAILED: process_id 4 on 127\.0\.0\.3 \(killed by SIGKILL\)", out, re.M), out
    assert not leftovers(tmp_path, run_dir, 2)


def _refused_start(tmp_path, hosts) -> tuple:
    """Host 1's job file path is a directory: putting the job there fails after host 0
    (max_parallel 1: hosts one after the other) started its 3 workers."""
    run_dir = tmp_path / "run"
    (remote_run_dir(tmp_path / "host1", run_dir) / "job.json").mkdir(parents=True)
    cluster = write_cluster(tmp_path, hosts, [0, 1], processes_per_host=3, max_parallel=1)
    result = launch("jobs/linear.yaml", "--cluster", cluster, *SMALL,
                    "--set", "distributed.initialization_timeout_s=600", "--run-dir", str(run_dir))
    return result, run_dir


@pytest.mark.slow
def test_a_start_that_fails_on_one_host_stops_every_started_worker(tmp_path, hosts):
    result, run_dir = _refused_start(tmp_path, hosts)
    err = result.stderr
    assert result.returncode == 1, result.stdout + err
    assert "could not start on every host; stopped the 3 processes already started:" in err, err
    assert re.search(r"127\.0\.0\.3: OSError: the start script of process 3 ended before its "
                     r"files were written: \S+/job\.json: is a directory", err), err
    assert "127.0.0.3: " in err and "Traceback" not in err
    # stopped before the launcher returned: no wait for JAX's initialization timeout (600 s)
    assert not leftovers(tmp_path, run_dir, 2)


@pytest.mark.slow
def test_a_host_that_refuses_more_connections_mid_start_stops_every_started_worker(tmp_path, hosts):
    """Host 1 takes 2 sessions per connection and, from its preflight on, no new connection
    (its listener is gone; open sessions carry on): with one held back for a stop
    (``HostChannels.reserve``), its first worker starts, its second cannot. Host 0's 3
    workers and host 1's first are stopped, the held session freed for it."""
    hosts.limit_sessions(1, 2)
    listener = hosts._procs[1].pid
    where = tmp_path / "host1"
    run_dir = tmp_path / "run"
    cluster = write_cluster(tmp_path, hosts, [0, 1], processes_per_host=3, max_parallel=1,
                            setup=[f'if [ "$PWD" = {where} ]; then kill {listener} 2>/dev/null || true; fi'])
    result = launch("jobs/linear.yaml", "--cluster", cluster, *SMALL,
                    "--set", "distributed.initialization_timeout_s=600", "--run-dir", str(run_dir))
    err = result.stderr
    assert result.returncode == 1, result.stdout + err
    assert "could not start on every host; stopped the 4 processes already started:" in err, err
    assert re.search(r"127\.0\.0\.3: \w+: .*(refused|Unable to connect)", err), err
    assert not leftovers(tmp_path, run_dir, 2)
