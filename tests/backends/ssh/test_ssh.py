"""The ssh backend against real OpenSSH servers on 127.0.0.2-127.0.0.5 (tests/harness/sshenv.py).

No mock of fabric or paramiko. All "hosts" are this machine, so each host gets
its own remote workdir, and "what remains on host i" is read from the process
table as the processes whose PODLAUNCH_RUN_DIR is host i's remote run dir.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from harness import helpers
from harness import sshenv
from harness.runs import remote_run_dir
from harness.helpers import (NO_RESTARTS, PACED, REPO, PROGRAMS, Output, launch, pids_with_env, program_job,
                             read_own_step_times, start_launch)
from launcher import backends
from launcher import plan as planning
from launcher import spec as specs
from launcher.backends.ssh import connection, hostscript
from launcher.backends.ssh import session as ssh_session
from launcher.backends.ssh import syncdir, transfer
from launcher.errors import SpecError
from launcher import remote
from launcher.remote import preflight as remote_preflight

NUM_HOSTS = 4
SHORT = ("--set", "train.num_steps=20", "--set", "cluster.devices_per_process=1")
# Long enough to be interrupted; quiet (no log lines, no watchdog heartbeats), so
# survivors of a dead connection do not die of EPIPE before the test looks for them.
# Quiet on purpose: an orphaned remote worker dies of a broken pipe at its next output
# line (progress, heartbeat, checkpoint message), which the survivor test must avoid.
LONG = ("--set", "train.num_steps=1000000", "--set", "logging.log_every_steps=100000",
        "--set", "watchdog.stall_timeout_s=null", "--set", "checkpoint.every_steps=0", *NO_RESTARTS,
        *PACED)


@pytest.fixture
def hosts(ssh_hosts):
    """The session's four sshd hosts (tests/conftest.py), every host restored after the test."""
    return ssh_hosts


def write_cluster(path, ssh_env, **settings) -> str:
    cluster = {
        "backend": "ssh",
        "hosts": [{"host": h, "workdir": str(path / f"host{i}")} for i, h in enumerate(ssh_env.hosts)],
        "ssh_config_file": ssh_env.ssh_config,  # gives User, Port, IdentityFile, UserKnownHostsFile
        "python": sys.executable,
        "env": {"PYTHONPATH": os.pathsep.join([PROGRAMS, REPO])},
        "grace_s": 2,
        "keepalive_interval_s": 1,
        "keepalive_timeout_s": 4,
    }
    cluster.update(settings)
    file = path / "cluster.yaml"
    file.write_text(yaml.safe_dump(cluster))
    return str(file)


def remote_run_dirs(path, run_dir, job="linear") -> list[str]:
    return [str(remote_run_dir(path / f"host{i}", run_dir, job)) for i in range(NUM_HOSTS)]


def survivors(path, run_dir, timeout_s=15.0, job="linear") -> dict:
    """{host index: live pids of this run there}, after waiting up to timeout_s for them to go."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = {i: pids for i, d in enumerate(remote_run_dirs(path, run_dir, job))
                 if (pids := pids_with_env("PODLAUNCH_RUN_DIR", d))}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def wait_launcher_gone(path, run_dir, count: int, timeout_s: float = 15.0, job="linear") -> None:
    """Wait until ``count`` pid records of the run say its launcher is gone
    (``launcher_gone_at``: the host's wrapper saw the launcher's channel end, polled every
    0.1 s, later on a loaded host): until then the workers are a live run's, which a launch
    beside them leaves alone, by design."""
    name = planning.remote_run_name(str(run_dir))
    pattern = os.path.join(str(path), "host*", ".podlaunch", job, f"{name}.process-*.pid")
    deadline = time.monotonic() + timeout_s
    while True:
        gone = 0
        for record in glob.glob(pattern):
            try:
                with open(record) as f:
                    gone += "launcher_gone_at" in json.load(f)
            except (OSError, ValueError):  # replaced while read
                pass
        if gone >= count:
            return
        assert time.monotonic() < deadline, f"{gone} of {count} pid records say the launcher is gone"
        time.sleep(0.1)


def wait_in_logs(run_dir, pattern: str, count: int, timeout_s: float = 90) -> None:
    """Wait until ``pattern`` matched ``count`` lines of the run's process logs (library
    noise such as gloo's "connected" lines reaches the logs only, not the console)."""
    deadline = time.monotonic() + timeout_s
    seen = 0
    while seen < count:
        assert time.monotonic() < deadline, f"{seen} of {count} lines matching {pattern!r}"
        time.sleep(0.1)
        seen = 0
        for log in glob.glob(os.path.join(str(run_dir), "logs", "process-*.log")):
            with open(log, encoding="utf-8", errors="replace") as f:
                seen += sum(bool(re.search(pattern, line)) for line in f)


def wait_for(proc, pattern: str, count: int, timeout_s: float = 90) -> Output:
    """Read the launcher's output until ``pattern`` matched ``count`` lines; fails at ``timeout_s``.

    Returns the Output reading ``proc`` (read the rest with its ``finish``).
    """
    out = Output.of(proc)
    out.wait_for(pattern, timeout_s, count)
    return out


# ---- no sshd needed ----------------------------------------------------------
def test_example_cluster_file_loads():
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"),
                     os.path.join(REPO, "jobs/clusters/ssh-example.yaml"), registry=backends)
    cluster = job.cluster
    assert cluster.backend == "ssh" and job.num_processes == 4
    assert [h.host for h in cluster.hosts] == ["trainer-a.invalid", "trainer-b.invalid",
                                               "trainer-c.invalid", "trainer-d.invalid"]
    assert (cluster.hosts[2].user, cluster.hosts[2].port) == ("ubuntu", 2222)
    assert cluster.python.startswith("/") and cluster.max_parallel == 32


def test_bad_ssh_settings_exit_2_listing_every_problem(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("backend: ssh\nhosts: []\nport: 70000\nhost_key_policy: yes\nmax_paralel: 4\n")
    result = launch("jobs/linear.yaml", "--cluster", str(file))
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert "Traceback" not in err
    assert f"{file}:2: cluster.hosts: expected at least one host" in err
    assert f"{file}:3: cluster.port: expected 1 to 65535, got 70000" in err
    assert "cluster.host_key_policy: expected one of strict, accept-new" in err
    assert "cluster.max_paralel: unknown key; did you mean 'max_parallel'?" in err


def test_precedence_spec_over_ssh_config_over_defaults(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host alias-a\n  HostName 127.0.0.2\n  User alice\n  Port 2201\n"
                      "  ConnectTimeout 7\n  UserKnownHostsFile /tmp/kh-from-config\n"
                      "  StrictHostKeyChecking accept-new\n")
    file = tmp_path / "c.yaml"
    file.write_text(yaml.safe_dump({"backend": "ssh", "ssh_config_file": str(config), "hosts": [
        "alias-a",                                               # all from ssh_config
        {"host": "alias-a", "user": "bob", "port": 2202},        # per-host spec wins
        "127.0.0.9"]}))                                          # defaults
    three = ("train.global_batch_size=24", "data.num_examples=24")
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), str(file), three + ("cluster.port=2299",),
                     registry=backends)
    session = ssh_session.SshSession(job, str(tmp_path / "run"))
    a, b, c = session.ssh.resolve()
    assert (a.connection.host, a.connection.user, a.connection.port) == ("127.0.0.2", "alice", 2299)
    assert (b.connection.user, b.connection.port) == ("bob", 2202)
    assert (a.connection.connect_timeout, c.connection.connect_timeout) == (7, 10)
    assert (a.known_hosts_file, a.host_key_policy) == ("/tmp/kh-from-config", "accept-new")
    assert c.known_hosts_file == os.path.expanduser("~/.ssh/known_hosts")
    assert c.host_key_policy == "strict" and c.connection.port == 2299
    # ids come from the plan, in host order, one process per host
    plan = planning.make_plan(job, session.ssh.placements([a, b, c]), str(tmp_path / "run"), "x:1")
    assert [[p.process_id for p in plan.on_host(i)] for i in range(3)] == [[0], [1], [2]]
    assert [p.host for p in plan.processes] == ["alias-a", "alias-a", "127.0.0.9"]
    missing = specs.load(os.path.join(REPO, "jobs/linear.yaml"), str(file),
                         three + ("cluster.ssh_config_file=/nonexistent/config",), registry=backends)
    with pytest.raises(SpecError, match="no such file: /nonexistent/config"):
        ssh_session.SshSession(missing, str(tmp_path / "run")).ssh.resolve()


# ---- preflight (no worker starts) --------------------------------------------
def _dry_run(tmp_path, ssh_env, *args, **settings):
    return launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, ssh_env, **settings),
                  "--dry-run", *SHORT, *args)


@pytest.mark.slow
def test_dry_run_preflights_and_masks_secrets(tmp_path, hosts):
    result = _dry_run(tmp_path, hosts, env={"PYTHONPATH": f"{PROGRAMS}:{REPO}", "API_TOKEN": "hunter2 $x"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "preflight ok on 4 hosts" in result.stdout
    assert "hunter2" not in result.stdout + result.stderr
    assert "API_TOKEN='****'" in result.stdout
    assert re.search(r"coordinator_address 127\.0\.0\.2:\d+", result.stdout)
    assert "p3 127.0.0.5: host 127.0.0.5, process_id 3" in result.stdout
    assert "job linear: 4 processes x 1 device = device_count 4" in result.stdout
    # one host, one process: every count in words of one (issue 29: "preflight ok on 1 hosts")
    one = launch("jobs/linear.yaml", "--cluster", write_cluster(
        tmp_path, hosts, hosts=[{"host": hosts.hosts[0], "workdir": str(tmp_path / "host0")}]),
        "--dry-run", *SHORT, "--set", "train.global_batch_size=64")
    assert one.returncode == 0, one.stdout + one.stderr
    assert re.search(r"^podlaunch: preflight ok on 1 host in ", one.stdout, re.M), one.stdout
    assert "job linear: 1 process x 1 device = device_count 1" in one.stdout
    assert "p0 127.0.0.2: host 127.0.0.2, process_id 0, 1 device, log " in one.stdout


@pytest.mark.slow
def test_host_down_and_rejected_key_start_nothing_anywhere(tmp_path, hosts):
    hosts.stop_host(1)
    hosts.reject_client_key(3)
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, hosts), *SHORT,
                    "--run-dir", str(run_dir))
    assert result.returncode == 1, result.stdout + result.stderr
    err = result.stderr
    assert "Traceback" not in err
    assert "preflight failed on 2 of 4 hosts; nothing was started anywhere" in err
    assert re.search(r"127\.0\.0\.3\s+p1\s+unreachable: connection refused", err), err
    assert re.search(r"127\.0\.0\.5\s+p3\s+authentication failed for user 'root'", err), err
    assert re.search(r"127\.0\.0\.2\s+p0\s+ok", err), err
    assert not survivors(tmp_path, run_dir, 0)
    assert not (run_dir / "logs").exists()


@pytest.mark.slow
def test_changed_host_key_is_refused_unknown_needs_accept_new(tmp_path, hosts):
    hosts.regenerate_host_key(2)
    result = _dry_run(tmp_path, hosts, host_key_policy="accept-new")  # never for a changed key
    assert result.returncode == 1
    assert re.search(r"127\.0\.0\.4\s+p2\s+host key CHANGED", result.stderr), result.stderr
    # the fingerprint as OpenSSH prints it, and advice that works when followed
    shown = subprocess.run(["ssh-keygen", "-lf", f"{hosts.host_key(2)}.pub"], capture_output=True,
                           text=True, check=True).stdout.split()[1]
    assert shown.startswith("SHA256:") and f"fingerprint {shown}," in result.stderr, result.stderr
    advice = re.search(r"remove the old key: (ssh-keygen -R .*)$", result.stderr, re.M).group(1)
    assert f"-R '[127.0.0.4]:{hosts.port}'" in advice
    copy = tmp_path / "known_hosts_copy"
    copy.write_text(open(hosts.known_hosts).read())
    subprocess.run(shlex.split(advice.replace(str(hosts.known_hosts), str(copy))),
                   capture_output=True, check=True)
    assert "127.0.0.4" not in copy.read_text() and "127.0.0.2" in copy.read_text()

    known = tmp_path / "known_hosts"
    lines = open(hosts.known_hosts).read().splitlines()
    known.write_text("\n".join(lines[:2]) + "\n")  # hosts 2 and 3 unknown
    result = _dry_run(tmp_path, hosts, known_hosts_file=str(known))
    assert result.returncode == 1
    assert re.search(r"127\.0\.0\.5\s+p3\s+unknown host key .*accept-new", result.stderr), result.stderr

    result = _dry_run(tmp_path, hosts, known_hosts_file=str(known), host_key_policy="accept-new")
    assert result.returncode == 0, result.stderr
    assert f"[127.0.0.5]:{hosts.port} ssh-ed25519" in known.read_text()


@pytest.mark.slow
def test_preflight_reports_version_and_import_problems(tmp_path, hosts):
    fake = tmp_path / "fakepy"
    fake.mkdir()
    (fake / "jax-0.0.1.dist-info").mkdir()
    (fake / "jax-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: jax\nVersion: 0.0.1\n")
    cluster = write_cluster(tmp_path, hosts)
    raw = yaml.safe_load(open(cluster))
    raw["hosts"][1]["workdir"] = str(tmp_path / "odd")
    raw["setup"] = [f'if [ "$PWD" = {tmp_path / "odd"} ]; then export PYTHONPATH={fake}; fi']
    raw["env"] = {}  # without tests/ on PYTHONPATH the user task's module is not importable
    open(cluster, "w").write(yaml.safe_dump(raw))
    result = launch("jobs/linear.yaml", "--cluster", cluster, "--dry-run", *SHORT,
                    "--set", "task.name=ssh_task:record_env")
    assert result.returncode == 1
    err = result.stderr
    assert re.search(r"127\.0\.0\.3\s+p1\s+version mismatch: jax 0\.0\.1 \(host 127\.0\.0\.2: ", err), err
    assert re.search(r"127\.0\.0\.2\s+p0\s+not importable: ssh_task; ", err), err


class _CountingSftp:
    """An SFTP client that records each call made on it: (method, its positional args)."""

    def __init__(self, sftp):
        self._sftp, self.calls = sftp, []

    def __getattr__(self, name):
        method = getattr(self._sftp, name)

        def call(*args, **kwargs):
            self.calls.append((name, *args))
            return method(*args, **kwargs)
        return call


def _preflight_saw(c, host, workdir: str) -> dict:
    """The ``synced`` answer of the real preflight program, run on ``host`` in ``workdir``."""
    args = {"modules": [], "port": None, "kill_stale": False, "grace_s": 1.0,
            "state_dir": ".podlaunch/none", "run_dir_env": "PODLAUNCH_RUN_DIR", "own_run_dir": "",
            "synced": syncdir.MANIFEST}
    status, out = connection.run_script(c.transport, hostscript.shell_script(
        workdir, (), {}, remote.python_call(host.python, "preflight", args)))
    assert status == 0, out
    return remote.parse_marked(out, remote_preflight.MARK)["synced"]


@pytest.mark.slow
def test_sync_dir_copies_only_what_changed_and_the_job_file_arrives_whole(tmp_path, hosts):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("A = 1\n")
    (src / "b.txt").write_text("b\n")
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "x.pyc").write_text("skip me")
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), write_cluster(tmp_path, hosts), SHORT[1::2],
                     registry=backends)
    host = ssh_session.SshSession(job, str(tmp_path / "run")).ssh.resolve()[0]
    remote_job = tmp_path / "made" / "run" / "job.json"
    with host.open() as c:
        sftp = c.sftp()
        target = str(tmp_path / "synced")
        assert syncdir.sync_dir(sftp, str(src), target) == 2
        # a relaunch that changes nothing only reads: the manifest, and an lstat per entry
        # (no own-source probe: that one writes, and runs before a sync's first change)
        counted = _CountingSftp(sftp)
        assert syncdir.sync_dir(counted, str(src), target) == 0
        assert sorted(counted.calls) == [
            ("lstat", f"{target}/b.txt"), ("lstat", f"{target}/pkg"),
            ("lstat", f"{target}/pkg/a.py"), ("open", f"{target}/{syncdir.MANIFEST}", "rb")]
        # and preflight's program, run there, tells the launcher so without any SFTP request
        assert syncdir.unchanged(_preflight_saw(c, host, target), str(src))
        (src / "pkg" / "a.py").write_text("A = 22\n")
        assert not syncdir.unchanged(_preflight_saw(c, host, target), str(src))
        assert syncdir.sync_dir(sftp, str(src), target) == 1
        assert syncdir.unchanged(_preflight_saw(c, host, target), str(src))
        # each kind of change on either side is seen: a file changed, gone or added there or
        # here, a directory gone there, a manifest that a directory above the source holds
        (tmp_path / "synced" / "b.txt").write_text("bb\n")
        assert not syncdir.unchanged(_preflight_saw(c, host, target), str(src))
        assert syncdir.sync_dir(sftp, str(src), target) == 1
        for change, undo in [
                (lambda: (src / "c.txt").write_text("c\n"), lambda: (src / "c.txt").unlink()),
                (lambda: (src / "b.txt").rename(tmp_path / "b"), lambda: (tmp_path / "b").rename(src / "b.txt")),
                (lambda: (tmp_path / "synced" / "b.txt").rename(tmp_path / "b"),
                 lambda: (tmp_path / "b").rename(tmp_path / "synced" / "b.txt")),
                (lambda: shutil.move(tmp_path / "synced" / "pkg", tmp_path / "pkg"),
                 lambda: shutil.move(tmp_path / "pkg", tmp_path / "synced" / "pkg")),
                (lambda: shutil.copytree(tmp_path / "synced" / ".podlaunch", tmp_path / ".podlaunch"),
                 lambda: shutil.rmtree(tmp_path / ".podlaunch"))]:
            change()
            assert not syncdir.unchanged(_preflight_saw(c, host, target), str(src))
            undo()
            assert syncdir.unchanged(_preflight_saw(c, host, target), str(src))
        # the job file, as each worker's script writes it before its worker starts
        # (hostscript.file_lines): the exact bytes, whatever the shell would make of them,
        # owner-only in directories made owner-only, no temporary left; written again, it
        # is replaced whole
        text = '{\n "args": "$HOME `id` $(id) \\\\ \'q\' \\"d\\" PODLAUNCH_EOF_0"\n}\n'
        inodes = []
        for body in (text, text, text.replace("id", "whoami")):
            script = hostscript.shell_script(str(tmp_path), (), {}, ["true"],
                                             ((str(remote_job), body, "w-p0"),))
            status, out = connection.run_script(c.transport, script)
            assert status == 0, out
            assert remote_job.read_text() == body
            inodes.append(os.stat(remote_job).st_ino)
        # the same bytes again: the file is left as it was (its readers keep it); new bytes
        # replace it whole
        assert inodes[0] == inodes[1] != inodes[2], inodes
    assert stat.S_IMODE(os.stat(remote_job).st_mode) == 0o600
    assert [stat.S_IMODE(os.stat(d).st_mode) for d in (remote_job.parent, remote_job.parent.parent)] == [0o700] * 2
    assert os.listdir(remote_job.parent) == ["job.json"]
    assert (tmp_path / "synced" / "pkg" / "a.py").read_text() == "A = 22\n"
    assert not (tmp_path / "synced" / "__pycache__").exists()


class _Chunks:
    """A channel's ``settimeout`` and ``recv`` over given chunks (then its end)."""

    def __init__(self, *chunks: bytes):
        self.chunks = list(chunks)

    def settimeout(self, timeout_s) -> None:
        pass

    def recv(self, size: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


def test_the_written_mark_is_taken_wherever_it_comes_and_the_lines_around_it_kept():
    mark = "podlaunch-job-written 0123abcd"
    # a login shell's title escape without a newline, the mark split across two reads
    got = connection.read_past(_Chunks(b"\x1b]0;host\x07\npodlaunch-job-wr",
                                       b"itten 0123abcd\npodlaunch-pgid t 12\nstep 1\n"), mark, 5)
    assert got == b"\x1b]0;host\x07\npodlaunch-pgid t 12\nstep 1\n"
    assert connection.read_past(_Chunks(b"a\n\n" + mark.encode() + b"\nb"), mark, 5) == b"a\nb"
    with pytest.raises(OSError, match="ended before its files were written: .*job.json: is a directory"):
        connection.read_past(_Chunks(b"/w/job.json: is a directory\n"), mark, 5)
    with pytest.raises(OSError, match="before its files were written"):  # never a mark: bounded
        connection.read_past(_Chunks(*[b"x" * 65536] * 40), mark, 5)


# ---- runs ----------------------------------------------------------------------
def _params(run_dir) -> dict:
    with np.load(os.path.join(run_dir, "params.npz")) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["pmap", "jit"])
def test_four_hosts_match_single_host_debug_mode(tmp_path, hosts, parallelism, reference_params):
    # jit on the hosts (one global mesh over 4 processes) against pmap locally: one local
    # 4-process run (reference_params) for both
    ssh_dir = tmp_path / "ssh-run"
    result = launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, hosts), *SHORT,
                    "--set", f"train.parallelism={parallelism}",
                    "--run-dir", str(ssh_dir), "--show", "all")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for i, host in enumerate(hosts.hosts):
        assert re.search(rf"^\[p{i} {re.escape(host)}\] step 20/20 loss", out, re.M), out
        log = (ssh_dir / "logs" / f"process-{i:03d}.log").read_text()
        assert "step 20/20" in log and "podlaunch-" not in log
    assert "OK: 4 processes succeeded" in out
    assert re.search(r"127\.0\.0\.2:\d+", out)
    got, want = _params(ssh_dir), reference_params(*SHORT, "--set", "cluster.num_processes=4")
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-7)
    events = [n for n in os.listdir(ssh_dir / "tensorboard")  # the workers' (not the ledger's)
              if n.startswith("events.out.tfevents") and not n.endswith(".goodput")]
    assert len(events) == 1 and events[0].endswith(".process-000"), events
    # each process's own run (its own step times, written by process 0) came back too
    assert sorted(read_own_step_times(str(ssh_dir / "tensorboard"))) == [0, 1, 2, 3]
    # the process-0-only rule where it can fail: hosts 1..3 write no TensorBoard or metrics
    remote = remote_run_dirs(tmp_path, ssh_dir)
    assert os.path.isdir(os.path.join(remote[0], "tensorboard"))
    for d in remote[1:]:
        assert os.path.isdir(d) and not os.path.exists(os.path.join(d, "tensorboard")), d
    assert not survivors(tmp_path, ssh_dir, 0)
    # the resolved job went to each host, into that run's own directory
    assert os.path.isfile(os.path.join(remote[3], "job.json"))


@pytest.mark.slow
def test_hosts_that_share_one_workdir_run(tmp_path, hosts):
    """Kind 1: one shared workdir (an NFS home) for all 4 hosts, a new run directory each run:
    the hosts create it at once."""
    shared = tmp_path / "shared-home"
    cluster = write_cluster(tmp_path, hosts)
    raw = yaml.safe_load(open(cluster))
    for h in raw["hosts"]:
        h["workdir"] = str(shared)
    open(cluster, "w").write(yaml.safe_dump(raw))
    for n in range(2):
        run_dir = tmp_path / f"run{n}"
        result = launch("jobs/linear.yaml", "--cluster", cluster, *SHORT, "--run-dir", str(run_dir))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "OK: 4 processes succeeded" in result.stdout
        remote = str(remote_run_dir(shared, run_dir))
        assert not pids_with_env("PODLAUNCH_RUN_DIR", remote)


@pytest.mark.slow
def test_reruns_in_the_default_layout_share_each_hosts_job_cache(tmp_path, hosts):
    # launch without --run-dir (runs/linear/<timestamp> here): each host's workers use
    # <workdir>/runs/linear/compilation-cache there, and a re-run's process 0 loads from it
    # (the hosts' sessions name the suite's shared cache in JAX_COMPILATION_CACHE_DIR, which a
    # worker would use instead: emptied, as on a host that sets none)
    cluster = write_cluster(tmp_path, hosts, env={"PYTHONPATH": os.pathsep.join([PROGRAMS, REPO]),
                                                  "JAX_COMPILATION_CACHE_DIR": ""})
    local = tmp_path / "here"
    local.mkdir()
    found = []
    for _ in range(2):
        result = launch(os.path.join(REPO, "jobs", "linear.yaml"), "--cluster", cluster, *SHORT,
                        "--set", "checkpoint.every_steps=0", "--show", "all", cwd=str(local))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        lines = re.findall(r"^\[p(\d) \S+\] compilation cache: (\d+) hits, \d+ misses; .* \((.+)\)$",
                           result.stdout, re.M)
        assert sorted(int(p) for p, _, _ in lines) == [0, 1, 2, 3], result.stdout[-3000:]
        for process_id, _, path in lines:
            assert path == str(tmp_path / f"host{process_id}" / "runs" / "linear" / "compilation-cache")
        found.append({int(p): int(h) for p, h, _ in lines})
    assert found[0][0] == 0 and found[1][0] > 0, found
    assert not (local / "runs" / "linear" / "compilation-cache").exists()  # nothing ran here


def test_mkdirs_tolerates_a_directory_made_meanwhile(tmp_path):
    made = set()

    class RacingSftp:  # another host makes the directory between our stat and our mkdir
        def stat(self, path):
            if path in made or os.path.isdir(path):
                return os.stat(path) if os.path.isdir(path) else None
            raise FileNotFoundError(path)

        def mkdir(self, path, mode=0o777):
            os.mkdir(path)  # the other host's
            made.add(path)
            raise OSError("Failure")

    target = tmp_path / "a" / "b"
    transfer.mkdirs(RacingSftp(), str(target))
    assert target.is_dir()


@pytest.mark.slow
def test_env_values_arrive_unchanged(tmp_path, hosts):
    values = {"SPACES": "a b  c", "QUOTES": "it's \"quoted\"", "DOLLAR": "$HOME ${PATH}",
              "SEMI": "x; touch /tmp/podlaunch-pwned", "TICKS": "`id` $(id)", "EMPTY": "",
              "NEWLINE": "one\ntwo", "BACKSLASH": "a\\b\\"}
    out_dir = tmp_path / "env-out"
    cluster = write_cluster(tmp_path, hosts, env={"PYTHONPATH": f"{PROGRAMS}:{REPO}", **values},
                            processes_per_host=2)
    raw = yaml.safe_load(open(cluster))
    raw["hosts"] = raw["hosts"][:2]  # 2 hosts x 2 processes
    open(cluster, "w").write(yaml.safe_dump(raw))
    result = launch("jobs/linear.yaml", "--cluster", cluster, "--set", "train.num_steps=2",
                    "--set", "task.name=ssh_task:record_env",
                    "--set", f"task.args.names={list(values)}", "--set", f"task.args.out_dir={out_dir}",
                    "--run-dir", str(tmp_path / "run"), "--show", "all")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^\[p3 127\.0\.0\.3\] done", result.stdout, re.M)
    for process_id in range(4):
        seen = yaml.safe_load((out_dir / f"process-{process_id}.json").read_text())
        assert seen == values
    assert not os.path.exists("/tmp/podlaunch-pwned")


def _faulty(kind, tmp_path, mode: str, helpers: bool = False) -> tuple:
    """200 steps, each logged, where process 2 fails at step 5 (``mode``: the trainer's
    faulty_task mode; a program job runs faulty_program from its own directory, synced to
    every host), every process starting two ``sleep 1234`` helpers with ``helpers``.
    Returns (launch arguments, the job's name); every mode but ``raise`` (a program error, not
    retried by default) with NO_RESTARTS."""
    once = () if mode == "raise" else NO_RESTARTS
    if kind == "program":
        program_mode = {"sigkill": "kill9"}.get(mode, mode) + ("+helpers" if helpers else "")
        return (program_job(tmp_path / "program", program_mode, target=2, at=5, steps=200,
                            log_every=1, num_processes=NUM_HOSTS), *once), "faulty"
    return ("jobs/linear.yaml", "--set", "train.num_steps=200", "--set", "logging.log_every_steps=1",
            "--set", "task.name=faulty_task:make", "--set", "task.args.crash_at_step=5",
            "--set", "task.args.crash_process_id=2", "--set", f"task.args.mode={mode}",
            "--set", f"task.args.helpers={str(helpers).lower()}", *once), "linear"


@pytest.mark.slow
@pytest.mark.parametrize("kind", helpers.KINDS)
def test_worker_sigkilled_at_step_k_stops_every_host(tmp_path, hosts, kind):
    run_dir = tmp_path / "run"
    job, name = _faulty(kind, tmp_path, "sigkill")
    result = launch(*job, "--cluster", write_cluster(tmp_path, hosts), "--run-dir", str(run_dir))
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"^FAILED: process_id 2 on 127\.0\.0\.4 \(killed by SIGKILL\) after step [45], its last "
                     r"logged step; it failed first\.", result.stdout, re.M), result.stdout
    assert re.search(r"attempt 0 failed: process_id 2 on 127\.0\.0\.4 was killed by SIGKILL \(no notice"
                     r".*\[infrastructure\]; not retrying: restarts\.max_restarts is 0 and 0 used",
                     result.stdout), result.stdout
    assert not survivors(tmp_path, run_dir, job=name)


@pytest.mark.slow
@pytest.mark.parametrize("kind", helpers.KINDS)
def test_helpers_that_left_the_workers_group_die_on_every_host(tmp_path, hosts, kind):
    """Each worker starts two ``sleep 1234`` (one in a session of its own); p2 fails: the
    teardown leaves nothing of the run, helpers included, on any host."""
    run_dir = tmp_path / "run"
    job, name = _faulty(kind, tmp_path, "raise", helpers=True)
    result = launch(*job, "--cluster", write_cluster(tmp_path, hosts), "--run-dir", str(run_dir),
                    "--show", "all")
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"^FAILED: process_id 2 on 127\.0\.0\.4 \(exit code 1\) at step 5", result.stdout,
                     re.M), result.stdout
    # the default budgets over ssh: a program error is named as one and not retried
    assert re.search(r"attempt 0 failed: process_id 2 on 127\.0\.0\.4 exited with code 1: a Python error "
                     r"in the job \[program error\]; not retried: a restart repeats it \(restarts\.program_errors is 0\)",
                     result.stdout), result.stdout
    assert "attempt 1" not in result.stdout
    started = rf"^\[p\d 127\.0\.0\.\d\] faulty_{kind.replace('trainer', 'task')}: started 2 helpers"
    assert len(re.findall(started, result.stdout, re.M)) == NUM_HOSTS, result.stdout
    assert not survivors(tmp_path, run_dir, job=name)  # helpers inherit PODLAUNCH_RUN_DIR: counted too


@pytest.mark.slow
def test_host_that_stops_answering_is_lost_and_stopped(tmp_path, hosts):
    run_dir = tmp_path / "run"
    proc = start_launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, hosts), *LONG,
                        "--run-dir", str(run_dir))
    stopped = []
    try:
        output = Output.of(proc)  # reads the launcher's output from the start
        wait_in_logs(run_dir, r"\[Gloo\] Rank \d is connected", 4)
        table = sshenv.proc_table()
        stopped = [p for p in sshenv._descendants(hosts._procs[1].pid) if table[p][1] == "sshd"]
        assert stopped
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        _, out = output.finish(60)
    finally:
        proc.kill()
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    assert proc.returncode == 1, out
    assert "FAILED: process_id 1 on 127.0.0.3 (lost: no answer for 4 s)" in out, out
    assert not survivors(tmp_path, run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("kind", helpers.KINDS)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_and_sigterm_stop_every_host(tmp_path, hosts, sig, kind):
    run_dir = tmp_path / "run"
    values = {"DB_PASSWORD": "pw-cmdline-4711", "PLAIN_SETTING": "plain-cmdline-4712"}
    cluster = write_cluster(tmp_path, hosts, env={"PYTHONPATH": os.pathsep.join([PROGRAMS, REPO]), **values})
    job, name = ("jobs/linear.yaml", *LONG), "linear"
    if kind == "program":  # as quiet as LONG: no log step, no heartbeat
        job, name = (program_job(tmp_path / "program", steps=1000000, log_every=100000,
                                 num_processes=NUM_HOSTS), "--set", "watchdog.stall_timeout_s=null"), "faulty"
    proc = start_launch(*job, "--cluster", cluster, "--run-dir", str(run_dir))
    try:
        wait_in_logs(run_dir, r"\[Gloo\] Rank \d is connected", 4)
        # every "host" is this machine: the whole process table is every remote process (sshd
        # sessions, sh, the wrappers, the workers) and the local ssh machinery. No env value is
        # in any command line (docs/ssh.md: the script goes to sh -s on stdin), though each
        # worker has it in its environment.
        assert len(survivors(tmp_path, run_dir, 0, job=name)) == NUM_HOSTS
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            for value in values.values():
                assert value.encode() not in cmdline, (pid, cmdline)
        assert pids_with_env("DB_PASSWORD", values["DB_PASSWORD"])
    finally:  # also when a check above failed: a SIGKILLed launcher would leave the workers running
        proc.send_signal(sig)
        try:
            _, out = Output.of(proc).finish(60)
        finally:
            proc.kill()
    assert proc.returncode == 130, out
    assert "INTERRUPTED: every process was stopped." in out
    assert not survivors(tmp_path, run_dir, job=name)


@pytest.mark.slow
def test_a_closed_stdout_goes_on_watching_every_host(tmp_path, hosts):
    """``launch ... | head -5`` over ssh: no traceback, the remote workers stay watched to
    the end, the summary lands in launcher.log, nothing is left on any host."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher.cli", "jobs/linear.yaml", "--cluster",
         write_cluster(tmp_path, hosts), *SHORT, "--set", "logging.log_every_steps=1",
         "--run-dir", str(run_dir)], cwd=REPO, env=helpers.env_for_tests(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        for _ in range(5):
            proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read().decode()
        proc.wait(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    log = (run_dir / "launcher.log").read_text()
    assert "the console went away" in log and "OK: 4 processes succeeded" in log, log
    assert not survivors(tmp_path, run_dir, 0)


@pytest.mark.slow
def test_sigkilled_launcher_leaves_recorded_survivors_for_the_next_launch(tmp_path, hosts):
    cluster = write_cluster(tmp_path, hosts)
    first = tmp_path / "first"
    proc = start_launch("jobs/linear.yaml", "--cluster", cluster, *LONG, "--run-dir", str(first))
    try:
        # every process past its first step, after which LONG prints nothing: a line printed
        # after the kill (gloo connects at the initial state's broadcast, before the step's
        # compilation and its lines) is a broken pipe that ends the survivor
        wait_in_logs(first, r"compilation cache: ", 4)
        proc.kill()
        proc.wait(10)
    finally:
        proc.kill()
    assert set(survivors(tmp_path, first, 0)) == set(range(NUM_HOSTS))  # no pty: they run on
    wait_launcher_gone(tmp_path, first, NUM_HOSTS)

    refused = launch("jobs/linear.yaml", "--cluster", cluster, *SHORT, "--run-dir", str(tmp_path / "second"))
    assert refused.returncode == 1, refused.stdout[-3000:] + refused.stderr
    assert re.search(r"127\.0\.0\.4\s+p2\s+1 process group of an earlier run of 'linear' still "
                     r"alive: p2 \(pgid \d+\) .*--kill-stale", refused.stderr), refused.stderr
    assert set(survivors(tmp_path, first, 0)) == set(range(NUM_HOSTS))  # refusing kills nothing

    cleaned = launch("jobs/linear.yaml", "--cluster", cluster, *SHORT, "--kill-stale",
                     "--run-dir", str(tmp_path / "third"))
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    # stopping one group can make its peers exit (a reset collective) before their own
    # host gets to them: at least one, at most all four, were stopped by us
    assert re.search(r"stopped [1-4] stale process groups?\b", cleaned.stdout), cleaned.stdout
    assert not survivors(tmp_path, first, 0)


@pytest.mark.slow
def test_a_launch_beside_a_live_one_of_the_same_job_runs_and_kill_stale_spares_it(tmp_path, hosts):
    # A sweep over ssh: the first launch's workers are survivors of "an earlier run" by name,
    # but their launcher is still connected (the wrapper watches its channel): not stale.
    # The two local run directories share their name ("run"): each host keeps one directory
    # per run all the same (its name hashes the local path), so neither is the other's own.
    cluster = write_cluster(tmp_path, hosts)
    first, second_dir = tmp_path / "a" / "run", tmp_path / "b" / "run"
    assert remote_run_dirs(tmp_path, first) != remote_run_dirs(tmp_path, second_dir)
    proc = start_launch("jobs/linear.yaml", "--cluster", cluster, *LONG, "--run-dir", str(first))
    try:
        wait_in_logs(first, r"\[Gloo\] Rank \d is connected", 4)
        second = launch("jobs/linear.yaml", "--cluster", cluster, *SHORT, "--kill-stale",
                        "--set", "optimizer.learning_rate=0.5", "--run-dir", str(second_dir))
        assert second.returncode == 0, second.stdout + second.stderr
        assert "its launcher still connected: this one runs beside it" in second.stdout
        assert "stale process group" not in second.stdout, second.stdout
        assert proc.poll() is None, "the live launch was stopped"
        assert set(survivors(tmp_path, first, 0)) == set(range(NUM_HOSTS))
        assert not survivors(tmp_path, second_dir, 0)
        assert all(os.path.isfile(os.path.join(d, "job.json"))
                   for d in remote_run_dirs(tmp_path, first) + remote_run_dirs(tmp_path, second_dir))
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        proc.kill()
    assert not survivors(tmp_path, first, 0)


def test_an_encrypted_key_is_named_as_such_not_as_paramikos_words(tmp_path, hosts):
    # issue 25, item 4: paramiko's PasswordRequiredException ("private key file is encrypted")
    # would read as a plain authentication failure; the fix is ssh-agent
    key = tmp_path / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "a passphrase", "-f", str(key)],
                   check=True)
    config = tmp_path / "ssh_config"  # the env's config, but with the locked key only
    config.write_text("".join(line for line in open(hosts.ssh_config)
                              if "IdentityFile" not in line))
    cluster = write_cluster(tmp_path, hosts, identity_file=str(key), ssh_config_file=str(config))
    env = {k: v for k, v in helpers.env_for_tests().items() if k != "SSH_AUTH_SOCK"}
    done = subprocess.run([sys.executable, "-m", "launcher.cli", "jobs/linear.yaml", "--cluster",
                           cluster, "--dry-run"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "is encrypted and no passphrase can be asked here" in done.stderr, done.stderr
    assert "add it to ssh-agent (ssh-add)" in done.stderr


@pytest.mark.slow
def test_helpers_detached_every_step_leave_no_pile_of_zombies_on_a_host(tmp_path, hosts):
    # issue 25, item 3, on hosts: the wrapper there is the orphans' subreaper and reaps them
    # as the run goes (tests/run/test_lifecycle.py has the local run)
    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "detach.py").write_text("import os\nfor step in range(500):\n"
                                    "    os.system(\"sh -c 'sleep 0.02 &'\")\nprint('done')\n")
    spec = tmp_path / "detach.yaml"
    spec.write_text(f"name: detach\nprogram: {{argv: [python, detach.py], dir: {prog}}}\n")
    two = [{"host": h, "workdir": str(tmp_path / f"host{i}")} for i, h in enumerate(hosts.hosts[:2])]
    cluster = write_cluster(tmp_path, hosts, hosts=two, devices_per_process=1)
    run_dir = tmp_path / "run"
    proc = start_launch(str(spec), "--cluster", cluster, "--run-dir", str(run_dir))
    most = helpers.most_zombies_while_running(
        proc, remote_run_dirs(tmp_path, run_dir, job="detach")[:2])
    out = proc.stdout.read()
    assert proc.returncode == 0, out[-3000:]
    assert "OK: 2 processes succeeded" in out, out[-3000:]
    # unreaped, they pile up to about 500 (one per step); reaped as the run goes, a few at once,
    # more while the machine is loaded (up to 32 seen here, on 2 cores busy with other tests)
    assert most <= 50, f"{most} zombies under the wrappers on the hosts at once"


@pytest.mark.slow
def test_a_setup_line_that_reads_stdin_neither_eats_the_script_nor_waits(tmp_path, hosts):
    # the script comes on stdin and a worker's channel stays open for the run: setup reads
    # /dev/null (a prompt, `cat`, `read`), never the rest of the script
    cluster = write_cluster(tmp_path, hosts, setup=["read -r answer || true", "cat >/dev/null",
                                                    "export FROM_SETUP=yes"])
    result = launch("jobs/linear.yaml", "--cluster", cluster, *SHORT, "--run-dir",
                    str(tmp_path / "run"), timeout_s=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "OK: 4 processes succeeded" in result.stdout


@pytest.mark.slow
def test_a_setup_lines_missing_command_is_told_from_a_missing_interpreter(tmp_path, hosts):
    # every exit 127 of the preflight was "python not found; set cluster.python", a setup
    # line's missing command too (a `conda activate` on a host without conda, skypilot#7001)
    only_host_1 = f'if [ "$PWD" = {tmp_path / "host1"} ]; then podlaunch_no_such_tool_xyz init; fi'
    cluster = write_cluster(tmp_path, hosts, setup=[only_host_1])
    result = launch("jobs/linear.yaml", "--cluster", cluster, *SHORT, "--dry-run", timeout_s=120)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    assert re.search(r"a command of cluster\.setup was not found on this host \(exit 127\): .*"
                     r"podlaunch_no_such_tool_xyz.*not found; run the setup lines by hand there",
                     result.stderr), result.stderr
    assert "set cluster.python" not in result.stderr
    assert hosts.hosts[1] in result.stderr
    cluster = write_cluster(tmp_path, hosts, python="/nonexistent/python3.99",
                            setup=["export FROM_SETUP=yes"])
    result = launch("jobs/linear.yaml", "--cluster", cluster, *SHORT, "--dry-run", timeout_s=120)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    assert "/nonexistent/python3.99 not found (" in result.stderr, result.stderr
    assert "set cluster.python to the remote interpreter's absolute path (or activate it in " \
           "cluster.setup)" in result.stderr
    assert "cluster.setup was not found" not in result.stderr


@pytest.mark.slow
def test_no_key_at_all_is_said_as_such_not_as_paramikos_words(tmp_path, hosts):
    # an empty ssh-agent and no identity file: "ssh failed: SSHException: No authentication
    # methods available"
    config = tmp_path / "ssh_config"
    config.write_text("".join(line for line in open(hosts.ssh_config)
                              if "IdentityFile" not in line and "IdentitiesOnly" not in line))
    cluster = write_cluster(tmp_path, hosts, ssh_config_file=str(config))
    result = launch("jobs/linear.yaml", "--cluster", cluster, *SHORT, "--dry-run", timeout_s=120,
                    HOME=str(tmp_path), SSH_AUTH_SOCK=None)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    assert "no key to log in as user " in result.stderr, result.stderr
    assert "no ssh-agent (SSH_AUTH_SOCK is unset), no identity_file is set" in result.stderr
    assert "load one into the agent (ssh-add) or set cluster.identity_file" in result.stderr
    assert "No authentication methods available" not in result.stderr


def test_kill_stale_is_refused_for_local_runs():
    result = launch("jobs/linear.yaml", "--kill-stale", "--dry-run")
    assert result.returncode == 2
    assert ("--kill-stale: only applies to backends whose hosts can outlive a launcher (ssh, tpu, slurm); "
            "this job's is local; remove the flag") in result.stderr


@pytest.mark.slow
def test_a_tilde_workdir_is_the_remote_home(tmp_path, hosts):
    """issue 12, kind 2: ``workdir: ~/x`` is ``$HOME/x`` on every host, as with ssh and scp."""
    name = f"podlaunch-tilde-{os.getpid()}"
    home = os.path.expanduser("~")  # every test host is this machine, logged in as this user
    try:
        result = _dry_run(tmp_path, hosts, hosts=[{"host": h, "workdir": f"~/{name}"}
                                                  for h in hosts.hosts])
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"PODLAUNCH_RUN_DIR={home}/{name}/runs/linear/" in result.stdout, result.stdout
        assert not os.path.exists(os.path.join(home, "~"))
    finally:
        shutil.rmtree(os.path.join(home, name), ignore_errors=True)


def test_the_example_cluster_run_as_it_is_reaches_nothing_and_says_its_hosts_are_placeholders():
    # a newcomer's report: the first run's next step ran this file, whose hosts were private
    # addresses (10.0.0.12 ...) that may belong to someone
    for extra in ((), ("--dry-run",)):
        result = launch("jobs/linear.yaml", "--cluster", "jobs/clusters/ssh-example.yaml", *extra)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        for i, name in enumerate(("trainer-a", "trainer-b", "trainer-c", "trainer-d")):
            assert f"cluster.hosts[{i}]: {name}.invalid is a placeholder (RFC 2606" in result.stderr
        assert "connect" not in result.stdout
