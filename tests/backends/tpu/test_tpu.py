"""The tpu backend: gcloud discovery (a stand-in gcloud on PATH), ids, multislice env,
stale TPU holders, and the CPU rehearsal. Hosts are real sshd on 127.0.0.2-5 (tests/harness/sshenv.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from harness import fake_gcloud
from harness.detached import workers_where
from harness.helpers import LAUNCH, REPO, PROGRAMS, env_for_tests
from launcher import backends
from launcher import plan as planning
from launcher import spec as specs
from launcher import tpu_topology
from launcher.backends.base import Options
from launcher.backends.tpu import discovery
from launcher.backends.tpu.session import TpuSession
from launcher.backends.tpu.settings import slice_env
from launcher.console import Console
from launcher.errors import LaunchError

ZONE = "us-central2-b"
TWO_SLICES = {"slice-a": ["127.0.0.2", "127.0.0.3"], "slice-b": ["127.0.0.4", "127.0.0.5"]}


def run_launch(bin_dir, *args, timeout_s=240) -> subprocess.CompletedProcess:
    env = env_for_tests(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(LAUNCH + list(args), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)


def write_cluster(path, ssh_env=None, **settings) -> str:
    cluster = {"backend": "tpu", "slices": list(TWO_SLICES), "zone": ZONE,
               "project": fake_gcloud.PROJECT, "accelerator_type": "v4-16",
               "platform": "cpu", "local_device_count": 1, "python": sys.executable,
               "workdir": str(path / "remote"), "grace_s": 2,
               "env": {"PYTHONPATH": os.pathsep.join([PROGRAMS, REPO])}}
    if ssh_env is not None:
        cluster.update(ssh_config_file=ssh_env.ssh_config, identity_file=ssh_env.identity_file,
                       # the loopback "hosts" share one disk; TPU VMs each have their own, so
                       # give each its own directory (named by the address it was reached at)
                       setup=['d="h-$(echo "$SSH_CONNECTION" | cut -d" " -f3)"; mkdir -p "$d"; cd "$d"'])
    cluster.update(settings)
    file = path / "cluster.yaml"
    file.write_text(yaml.safe_dump(cluster))
    return str(file)


def install_two_slices(bin_dir, state_b="READY"):
    return fake_gcloud.install(bin_dir, {
        "slice-a": fake_gcloud.node("v4-16", TWO_SLICES["slice-a"]),
        "slice-b": fake_gcloud.node("v4-16", TWO_SLICES["slice-b"], state=state_b)})


# ---- topology and ids (no hosts) ------------------------------------------------------
@pytest.mark.parametrize("accelerator_type,hosts,devices", [
    ("v4-8", 1, 4), ("v4-32", 4, 4), ("v3-32", 4, 8), ("v5p-16", 2, 4),
    ("v5litepod-8", 1, 8), ("v5litepod-16", 4, 4), ("v6e-256", 64, 4)])
def test_topology_table(accelerator_type, hosts, devices):
    t = tpu_topology.topology(accelerator_type)
    assert (t.hosts, t.devices_per_host) == (hosts, devices)


def test_jax_coordinator_port_follows_jax_version():
    assert tpu_topology.jax_coordinator_port("0.8.0") == 8476
    assert tpu_topology.jax_coordinator_port("0.8.1") == 8482
    assert tpu_topology.jax_coordinator_port("0.10.2") == 8482


def test_ids_are_unique_and_megascale_env_per_slice(tmp_path, monkeypatch):
    ips = {f"s{i}": [f"127.0.0.{10 + 4 * i + w}" for w in range(4)] for i in range(3)}
    fake_gcloud.install(tmp_path / "bin", {n: fake_gcloud.node("v4-32", a) for n, a in ips.items()})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"),
                     write_cluster(tmp_path, slices=list(ips), accelerator_type="v4-32"),
                     ("train.global_batch_size=240",), registry=backends)
    found = discovery.discover(job)
    assert [(h.slice_index, h.worker_index) for h in found.hosts] == \
        [(s, w) for s in range(3) for w in range(4)]
    assert found.hosts[5].address == ips["s1"][1]
    # ids come from the plan over the session's placements (slice-major, one process per host)
    session = TpuSession(job, str(tmp_path / "run"))
    ssh = session.hosts_of(found)
    placements = ssh.placements(ssh.resolve(), session.slice_envs(len(found.hosts), "127.0.0.10"))
    plan = planning.make_plan(job, placements, str(tmp_path / "run"), "127.0.0.10:8482")
    ids = [p.process_id for p in plan.processes]
    assert ids == list(range(12)) and len(set(ids)) == 12
    assert [p.host for p in plan.processes] == sum(ips.values(), [])
    env = plan.processes[5].env
    assert env["MEGASCALE_SLICE_ID"] == "1" and env["MEGASCALE_NUM_SLICES"] == "3"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "127.0.0.10:8080" and env["MEGASCALE_PORT"] == "8080"
    assert "MEGASCALE_SLICE_ID" not in slice_env(dataclasses.replace(job.cluster, slices=("s0",)), 0, "x")
    assert fake_gcloud.calls(tmp_path / "bin")[0] == [
        "compute", "tpus", "tpu-vm", "describe", "s0", "--zone", ZONE, "--project",
        fake_gcloud.PROJECT, "--format=json"]


@pytest.mark.parametrize("prefix,names", [("np", ["np-0", "np-1"]),
                                          (None, ["qr-0", "qr-1"])])  # nodeIdPrefix is optional
def test_queued_resource_names_its_slices(tmp_path, monkeypatch, prefix, names):
    fake_gcloud.install(tmp_path / "bin", {
        names[0]: fake_gcloud.node("v4-16", TWO_SLICES["slice-a"], queued_resource="qr"),
        names[1]: fake_gcloud.node("v4-16", TWO_SLICES["slice-b"], queued_resource="qr")},
        {"qr": fake_gcloud.queued_resource("v4-16", 2, prefix)})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    cluster = write_cluster(tmp_path, slices=None, queued_resource="qr", num_slices=2)
    raw = yaml.safe_load(open(cluster))
    del raw["slices"]
    open(cluster, "w").write(yaml.safe_dump(raw))
    found = discovery.discover(specs.load(os.path.join(REPO, "jobs/linear.yaml"), cluster,
                                          registry=backends))
    assert [s[0] for s in found.slices] == names
    assert [h.address for h in found.hosts] == TWO_SLICES["slice-a"] + TWO_SLICES["slice-b"]


@pytest.mark.parametrize("ip", ["internal", "external"])
def test_ip_picks_the_internal_or_the_external_address(tmp_path, monkeypatch, ip):
    install_two_slices(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), write_cluster(tmp_path, ip=ip),
                     registry=backends)
    internal = sum(TWO_SLICES.values(), [])
    want = internal if ip == "internal" else [fake_gcloud.external_ip(a) for a in internal]
    assert [h.address for h in discovery.discover(job).hosts] == want


def test_external_ip_asked_of_a_slice_without_one_is_bad_input(tmp_path):
    fake_gcloud.install(tmp_path / "bin", {
        "slice-a": fake_gcloud.node("v4-16", TWO_SLICES["slice-a"]),
        "slice-b": fake_gcloud.node("v4-16", TWO_SLICES["slice-b"], external=False)})
    result = run_launch(tmp_path / "bin", "jobs/linear.yaml", "--cluster", write_cluster(tmp_path, ip="external"),
                        "--dry-run")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cluster.ip: slice-b worker 0 has no external IP; use ip: internal" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["tpu-v4-32.yaml", "tpu-multislice.yaml"])
def test_shipped_tpu_examples_load(name):
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), os.path.join(REPO, "jobs/clusters", name),
                     registry=backends)
    # derived from the accelerator type (v4-32: 4 hosts of 4 chips; v4-16: 2 hosts) and the slice
    # count, not written in the files
    assert (job.num_processes, job.local_device_count) == {"tpu-v4-32.yaml": (4, 4),
                                                          "tpu-multislice.yaml": (4, 4)}[name]
    assert job.cluster.hosts_per_slice * job.cluster.slice_count == job.num_processes


def test_bad_tpu_spec_is_exit_2_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("backend: tpu\nzone: us-central2-b\ntpu: a\nslices: [b]\naccelerator_type: v4-12\n")
    result = run_launch(tmp_path, "jobs/linear.yaml", "--cluster", str(bad), "--dry-run")
    assert result.returncode == 2, result.stderr
    assert f"{bad}:5: cluster.accelerator_type: v4-12: v4 sizes count TensorCores" in result.stderr
    bad.write_text("backend: tpu\nzone: us-central2-b\ntpu: a\nslices: [b]\naccelerator_type: v4-8\n")
    result = run_launch(tmp_path, "jobs/linear.yaml", "--cluster", str(bad), "--dry-run")
    assert result.returncode == 2
    assert "cluster.tpu: expected exactly one of tpu (one slice), slices (a list) or queued_resource, " \
           "got tpu, slices" in result.stderr


def test_not_ready_tpu_is_a_clear_error_and_nothing_starts(tmp_path):
    install_two_slices(tmp_path / "bin", state_b="PREEMPTED")
    run_dir = tmp_path / "run"
    result = run_launch(tmp_path / "bin", "jobs/linear.yaml", "--cluster", write_cluster(tmp_path),
                        "--run-dir", str(run_dir))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "TPU slice-b is PREEMPTED, not READY: it was preempted" in result.stderr
    assert "Nothing was started." in result.stderr and "Traceback" not in result.stderr
    assert not run_dir.exists()


def test_unknown_tpu_is_bad_input(tmp_path):
    fake_gcloud.install(tmp_path / "bin", {})
    result = run_launch(tmp_path / "bin", "jobs/linear.yaml", "--cluster", write_cluster(tmp_path))
    assert result.returncode == 2, result.stderr
    # gcloud says it in three lines; the user sees the NOT_FOUND one, not the ResourceInfo detail
    assert re.search(r"cluster\.slices: 'slice-a' was not found in zone us-central2-b, project "
                     r"test-project \(gcloud: "
                     r"NOT_FOUND: Resource 'projects/test-project/locations/us-central2-b/nodes/slice-a' "
                     r"was not found\. This command is authenticated as .*\); check the name, zone "
                     r"and project \(docs/tpu\.md\)$", result.stderr, re.M), result.stderr
    assert "ResourceInfo" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["tpu-v4-32.yaml", "tpu-multislice.yaml"])
def test_shipped_tpu_examples_run_as_they_are_ask_no_gcloud_and_name_each_placeholder(tmp_path, name):
    """Issue 70: the TPU quick start's file as shipped (``my-v4-32``, ``my-project``, ...), even
    with ``--dry-run``, is refused as the ssh example's ``.invalid`` hosts are: exit 2, file,
    line and key of each placeholder, and gcloud never runs (a stand-in first on PATH
    records every call); ``--rehearse`` still runs the example here."""
    fake_gcloud.install(tmp_path / "bin", {})
    cluster = f"jobs/clusters/{name}"  # as the quick start types it
    for extra in ((), ("--dry-run",)):
        result = run_launch(tmp_path / "bin", "jobs/linear.yaml", "--cluster", cluster, *extra)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "Traceback" not in result.stderr and not result.stdout, result.stdout
        said = {"tpu-v4-32.yaml": [(8, "cluster.tpu", "my-v4-32", "the TPU's name")],
                "tpu-multislice.yaml": [(6, "cluster.slices[0]", "my-slice-0", "a slice's name"),
                                        (6, "cluster.slices[1]", "my-slice-1", "a slice's name")]}[name]
        said += [(10, "cluster.project", "my-project", "the GCP project"),
                 ({"tpu-v4-32.yaml": 14}.get(name, 12), "cluster.user", "my-user",
                  "the login on the TPU VMs")]
        for line, key, value, what in said:
            assert (f"error: jobs/clusters/{name}:{line}: {key}: {value} is the example's "
                    f"placeholder for {what}: put yours there") in result.stderr, result.stderr
        assert result.stderr.count("gcloud was not asked") == len(said), result.stderr
    assert fake_gcloud.calls(tmp_path / "bin") == []
    rehearsed = run_launch(tmp_path / "bin", "jobs/linear.yaml", "--cluster", cluster,
                           "--rehearse", "--dry-run", "--run-dir", str(tmp_path / "run"))
    assert rehearsed.returncode == 0 and fake_gcloud.calls(tmp_path / "bin") == [], rehearsed.stderr


@pytest.mark.parametrize("signed_in,project,code,said", [
    (False, fake_gcloud.PROJECT, 1, "gcloud could not describe 'slice-a' in zone us-central2-b, "
     "project test-project: You do not currently have an active account selected.; sign in "
     "first (gcloud auth login, or gcloud config set account ACCOUNT), then launch again "
     "(docs/tpu.md); nothing was started"),
    (True, None, 2, "cluster.project: gcloud could not describe 'slice-a' in zone us-central2-b: "
     "Error parsing [tpu].; set cluster.project, or gcloud's own: gcloud config set project "
     "PROJECT (docs/tpu.md)")])
def test_gclouds_failure_is_one_sentence_with_what_to_do(tmp_path, signed_in, project, code, said):
    """Issue 70: gcloud without an account (the machine's to fix: exit 1) or without a project
    (the spec's: exit 2) is said in one line of ours, with what to do and the doc, not in
    gcloud's dozen lines; nothing starts."""
    fake_gcloud.install(tmp_path / "bin", {}, signed_in=signed_in, default_project=None)
    result = run_launch(tmp_path / "bin", "jobs/linear.yaml", "--cluster",
                        write_cluster(tmp_path, project=project), "--dry-run")
    assert result.returncode == code, result.stdout + result.stderr
    assert said in result.stderr and len(result.stderr.splitlines()) <= 2, result.stderr
    assert "Please run" not in result.stderr and "Traceback" not in result.stderr


def test_rehearse_needs_a_tpu_cluster():
    result = subprocess.run(LAUNCH + ["jobs/linear.yaml", "--rehearse", "--dry-run"], cwd=REPO,
                            env=env_for_tests(), capture_output=True, text=True)
    assert result.returncode == 2
    assert ("--rehearse: only applies to cluster.backend: local with cluster.platform tpu or gpu, "
            "or tpu (this job's is local on cpu); remove the flag") in result.stderr


# ---- on real sshd hosts -----------------------------------------------------------------
@pytest.fixture
def hosts(ssh_hosts):
    """The session's four sshd hosts (tests/conftest.py), restored after the test."""
    return ssh_hosts


def test_a_stale_lockfile_another_host_removes_first_is_removed_not_a_crash(tmp_path, monkeypatch):
    # hosts that share the lockfile's path (one machine's /tmp in the tests, a shared
    # filesystem): two holder checks see it stale at once and both remove it
    from launcher.remote import holders as remote_holders

    lockfile = tmp_path / "libtpu_lockfile"
    lockfile.write_text("")
    real_unlink = os.unlink

    def first_the_other_host(path):
        real_unlink(path)
        real_unlink(path)  # this host's own, after the other host's

    monkeypatch.setattr(remote_holders.os, "unlink", first_the_other_host)
    out = remote_holders.main({"globs": [], "lockfile": str(lockfile), "stop_others": False,
                               "dry_run": False, "grace_s": 1, "port": None,
                               "run_dir_env": "PODLAUNCH_RUN_DIR"})
    assert out["lockfile"] == "removed" and not lockfile.exists()


@pytest.mark.slow  # starts sshd
def test_dry_run_shows_discovered_hosts_ids_and_megascale(tmp_path, hosts):
    install_two_slices(tmp_path / "bin")
    result = run_launch(tmp_path / "bin", "jobs/linear.yaml", "--cluster",
                        write_cluster(tmp_path, hosts), "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "discovered 2 slices x 2 hosts with gcloud:" in out
    assert re.search(r"slice 1 slice-b \(v4-16, READY\):\n\s+worker 0  127\.0\.0\.4  p2", out), out
    assert "coordinator_address 127.0.0.2:8482" in out  # jax 0.10 here: JAX's TPU default port
    for process_id, host in enumerate(sum(TWO_SLICES.values(), [])):
        line = re.search(rf"^  env .*PODLAUNCH_PROCESS_ID={process_id} .*$",
                         out.split(f"p{process_id} {host}: host {host}, process_id {process_id}")[1],
                         re.M).group(0)
        assert f"MEGASCALE_SLICE_ID={process_id // 2} " in line
        assert "MEGASCALE_COORDINATOR_ADDRESS=127.0.0.2:8080 MEGASCALE_NUM_SLICES=2" in line
        assert "MEGASCALE_PORT=8080" in line


@pytest.mark.slow
def test_two_slices_train_with_the_right_identity(tmp_path, hosts):
    install_two_slices(tmp_path / "bin")
    out_dir, run_dir = tmp_path / "env-out", tmp_path / "run"
    names = ["PODLAUNCH_PROCESS_ID", "PODLAUNCH_NUM_PROCESSES", "MEGASCALE_COORDINATOR_ADDRESS",
             "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_PORT"]
    # coordinator_port 0 (a free one): JAX's default, 8482 on 127.0.0.2, is the dry run's to
    # find free (test_dry_run_shows_discovered_hosts_ids_and_megascale, on another xdist worker)
    result = run_launch(tmp_path / "bin", "jobs/linear.yaml", "--cluster",
                        write_cluster(tmp_path, hosts, coordinator_port=0),
                        "--set", "train.num_steps=3", "--set", "task.name=ssh_task:record_env",
                        "--set", f"task.args.names={names}", "--set", f"task.args.out_dir={out_dir}",
                        "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: 4 processes succeeded" in result.stdout
    for process_id in range(4):
        seen = json.loads((out_dir / f"process-{process_id}.json").read_text())
        assert seen == {"PODLAUNCH_PROCESS_ID": str(process_id), "PODLAUNCH_NUM_PROCESSES": "4",
                        "MEGASCALE_COORDINATOR_ADDRESS": "127.0.0.2:8080", "MEGASCALE_NUM_SLICES": "2",
                        "MEGASCALE_SLICE_ID": str(process_id // 2), "MEGASCALE_PORT": "8080"}
    assert (run_dir / "params.npz").exists()


def _holder(tmp_path, held: str, env: dict) -> subprocess.Popen:
    """A process (own session) that keeps ``held`` open until killed."""
    code = f"import time; f = open({held!r}, 'a'); print('ready', flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **env},
                            start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_live_launch_holding_the_tpu_is_never_stopped_even_when_asked(tmp_path, capsys):
    # issue 25, item 2: the holder check stops others' holders only on request, and a
    # worker of another launch of this job whose launcher is still connected never
    from launcher.remote import holders as remote_holders

    device = tmp_path / "accel0"
    device.write_text("")
    live_run = str(tmp_path / "runs" / "linear" / "live")
    live = _holder(tmp_path, str(device), {"PODLAUNCH_RUN_DIR": live_run})
    try:
        args = {"globs": [str(device)], "lockfile": str(tmp_path / "libtpu_lockfile"),
                "stop_others": True, "dry_run": False, "grace_s": 1, "port": None,
                "run_dir_env": "PODLAUNCH_RUN_DIR", "spare_run_dirs": [live_run]}
        out = remote_holders.main(args)
        assert out["stopped"] == [] and live.poll() is None
        assert [h["podlaunch_run_dir"] for h in out["holders"]] == [live_run]
        out = remote_holders.main({**args, "spare_run_dirs": []})  # not live: stopped
        assert out["stopped"] == [live.pid] and live.wait(10) is not None
    finally:
        live.kill()
    capsys.readouterr()


@pytest.mark.slow  # starts sshd
def test_stale_holders_ours_always_others_only_when_asked(tmp_path, hosts, monkeypatch):
    install_two_slices(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    lockfile, device = tmp_path / "libtpu_lockfile", tmp_path / "accel0"
    device.write_text("")
    cluster = write_cluster(tmp_path, hosts, libtpu_lockfile=str(lockfile),
                            tpu_device_paths=[str(tmp_path / "accel*")], coordinator_port=0)
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), cluster, registry=backends)
    # an earlier run of ours, recorded in a pid file as the ssh backend records workers
    stale_run = str(tmp_path / "remote" / "h-127.0.0.2" / "runs" / "linear" / "old")
    ours = _holder(tmp_path, str(lockfile), {"PODLAUNCH_RUN_DIR": stale_run})
    state_dir = tmp_path / "remote" / "h-127.0.0.2" / ".podlaunch" / "linear"
    state_dir.mkdir(parents=True)
    (state_dir / "process-000.pid").write_text(json.dumps(
        {"pgid": ours.pid, "run_dir": stale_run, "process_id": 0, "node": socket.gethostname()}))
    other = _holder(tmp_path, str(device), {})
    lines = []
    console = Console()
    console.say = lines.append
    options = Options(python=sys.executable)
    try:
        session = TpuSession(job, str(tmp_path / "run1"), console, options)
        with pytest.raises(LaunchError) as refused:
            session.prepare()
        session.close()
        assert ours.wait(10) is not None  # ours: stopped without asking
        assert re.search(rf"127\.0\.0\.2\s+p0\s+TPU in use: pid {other.pid} \(.*\) holds {device}; "
                         r"--set cluster.stop_other_tpu_holders=true stops them", str(refused.value))
        assert other.poll() is None and any("stopped 1 stale process group" in l for l in lines)

        job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), cluster,
                         ("cluster.stop_other_tpu_holders=true",), registry=backends)
        lockfile.write_text("")  # left behind by a holder that is gone
        lines.clear()
        dry = TpuSession(job, str(tmp_path / "dry"), console,
                         Options(python=sys.executable, dry_run=True))
        dry.prepare()  # reports, stops nothing, removes nothing
        dry.close()
        assert other.poll() is None and lockfile.exists()
        assert any(f"would stop processes holding the TPU (dry run): {other.pid}" in l for l in lines), lines
        assert any(f"would remove stale {lockfile} (dry run)" in l for l in lines), lines
        lines.clear()
        session = TpuSession(job, str(tmp_path / "run2"), console, options)
        session.prepare()
        session.close()
        assert other.wait(10) is not None
        assert not lockfile.exists()
        assert any(f"stopped processes holding the TPU: {other.pid}" in l for l in lines), lines
        assert any(f"removed stale {lockfile} (no process held it)" in l for l in lines), lines
    finally:
        ours.kill()
        other.kill()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("parallelism", ["pmap", "jit"])
def test_rehearsal_of_v4_32_matches_one_process_with_16_devices(tmp_path, parallelism,
                                                                reference_params):
    # the rehearsal with jit (a global mesh of 4 processes x 4 devices) against pmap in one
    # process (one run for both parametrizations: reference_params)
    steps = ("--set", "train.num_steps=5", "--set", "train.global_batch_size=64",
             "--set", "logging.tensorboard=false")
    rehearsal = run_launch(tmp_path, "jobs/linear.yaml", "--cluster", "jobs/clusters/tpu-v4-32.yaml",
                           "--rehearse", *steps, "--set", f"train.parallelism={parallelism}",
                           "--run-dir", str(tmp_path / "rehearsal"))
    assert rehearsal.returncode == 0, rehearsal.stdout + rehearsal.stderr
    assert "rehearsing 1 x v4-32 on this machine: 4 processes (one per TPU host) x 4 CPU devices" \
        in rehearsal.stdout
    assert "OK: 4 processes succeeded" in rehearsal.stdout
    want = reference_params(*steps, "--set", "cluster.num_processes=1",
                            "--set", "cluster.devices_per_process=16")
    with np.load(tmp_path / "rehearsal" / "params.npz") as got:
        assert sorted(got.files) == sorted(want)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_a_detached_tpu_run_is_stopped_by_name_with_nothing_left_on_any_host(tmp_path, hosts):
    # two slices of two hosts (fake gcloud, real sshd): the supervisor leaves the terminal;
    # `launch wait` and `launch stop` reach it by its run directory, and the stop returns once
    # no process of the run is left on any host
    from harness.helpers import PACED
    from launcher.plan import remote_run_name

    install_two_slices(tmp_path / "bin")
    run_dir = tmp_path / "run"
    started = run_launch(tmp_path / "bin", "jobs/linear.yaml", "--cluster",
                         write_cluster(tmp_path, hosts, coordinator_port=0),  # not the dry run's
                         "--set", "train.num_steps=1000000",
                         "--set", "logging.log_every_steps=20", *PACED, "--run-dir", str(run_dir),
                         "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    record = run_dir / "run.json"
    pid = json.loads(record.read_text())["launcher"]["pid"]
    name = remote_run_name(str(run_dir)).encode()

    def on_hosts() -> list:
        """Pids of the run's processes on the hosts (their PODLAUNCH_RUN_DIR ends in its name)."""
        return workers_where(lambda run_dir: run_dir.endswith(name))

    try:
        deadline = time.monotonic() + 180
        while (json.loads(record.read_text()).get("step") or 0) < 40:
            assert time.monotonic() < deadline, "run.json's step did not reach 40"
            time.sleep(0.2)
        assert len(on_hosts()) >= 4  # training on every host
        assert run_launch(tmp_path / "bin", "wait", str(run_dir), "--timeout", "0.5").returncode == 124
        stopped = run_launch(tmp_path / "bin", "stop", str(run_dir), timeout_s=300)
        left = on_hosts()  # at once: no waiting
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not left, left
        assert run_launch(tmp_path / "bin", "wait", str(run_dir)).returncode == 130
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
