"""Single-host mode on this machine's accelerators (``cluster.platform``), read through ``launch``.

The chips are device files (``cluster.tpu_device_paths``, ``gpu_device_paths``): here real
files in a temporary directory stand for a TPU VM's ``/dev/accel*`` or ``/dev/vfio/N`` and a
GPU box's ``/dev/nvidia*``, counted and checked for holders exactly as the real ones are
(``launcher.backends.local.devices``: globs, then ``/proc/*/fd``). The holders are real
processes with the files open. Every ``launch`` is the real command line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from harness.helpers import LAUNCH, REPO, env_for_tests, launch
from harness.nosockets import SAID, loopback_down, no_socket_env


def chips(tmp_path, n: int, name: str = "accel", extra=()) -> str:
    """``n`` chip files ``<name>0``... (and ``extra`` others) in a folder; returns its glob."""
    folder = tmp_path / "dev"
    folder.mkdir(exist_ok=True)
    for i in range(n):
        (folder / f"{name}{i}").write_text("")
    for other in extra:
        (folder / other).write_text("")
    return str(folder / f"{name}*")


def tpu_launch(tmp_path, pattern: str, *sets: str, dry_run: bool = True):
    args = ["jobs/linear.yaml", "--set", "cluster.platform=tpu",
            "--set", f"cluster.tpu_device_paths=[{pattern!r}]",
            "--set", f"cluster.libtpu_lockfile={tmp_path / 'libtpu_lockfile'}",
            "--set", "cluster.num_processes=null", "--set", "cluster.devices_per_process=null",
            "--run-dir", str(tmp_path / "run")]
    for item in sets:
        args += ["--set", item]
    return launch(*args, *(["--dry-run"] if dry_run else []))


def envs(stdout: str) -> list[dict]:
    """Each process's environment as the dry run prints it."""
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in stdout.splitlines()
            if line.startswith("  env ")]


@pytest.mark.parametrize("num_chips,num_processes,visible,bounds", [
    (4, 1, None, None),
    (4, 2, ["0,1", "2,3"], ("2,1,1", "1,2,1")),
    (4, 4, ["0", "1", "2", "3"], ("1,1,1", "2,2,1")),
    (8, 1, None, None),
    (8, 2, ["0,1,2,3", "4,5,6,7"], ("2,2,1", "1,2,1")),
    (8, 8, [str(i) for i in range(8)], ("1,1,1", "2,4,1")),
])
def test_the_dry_run_says_the_chips_and_gives_each_process_its_own(tmp_path, num_chips,
                                                                    num_processes, visible, bounds):
    done = tpu_launch(tmp_path, chips(tmp_path, num_chips), f"cluster.num_processes={num_processes}")
    assert done.returncode == 0, done.stderr
    assert f"devices: {num_chips} TPU chips found on this machine" in done.stdout
    per = num_chips // num_processes
    assert f"{num_processes} process{'es' if num_processes > 1 else ''} x {per} device" in done.stdout
    found = envs(done.stdout)
    assert len(found) == num_processes
    for process_id, env in enumerate(found):
        assert env["JAX_PLATFORMS"] == "tpu" and env["PODLAUNCH_PLATFORM"] == "tpu"
        assert env["PODLAUNCH_LOCAL_DEVICE_COUNT"] == str(per)
        if visible is None:  # one process: every chip, libtpu left to its defaults
            assert "one process gets every one" in done.stdout
            assert not any(k.startswith("TPU_") for k in env)
            assert env["PODLAUNCH_COORDINATOR_ADDRESS"] == "127.0.0.1:0"  # no port picked
            continue
        assert env["TPU_VISIBLE_CHIPS"] == visible[process_id]
        assert (env["TPU_CHIPS_PER_PROCESS_BOUNDS"], env["TPU_PROCESS_BOUNDS"]) == bounds
        assert env["CLOUD_TPU_TASK_ID"] == str(process_id)
        assert env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
        addresses = env["TPU_PROCESS_ADDRESSES"].split(",")
        assert len(set(addresses)) == num_processes
        assert addresses[process_id] == f"localhost:{env['TPU_PROCESS_PORT']}"
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


@pytest.mark.parametrize("num_chips,num_processes,works", [
    (4, 3, "1, 2, 4"), (8, 4, "1, 2, 8"), (8, 3, "1, 2, 8"), (1, 2, "1"), (4, 5, "1, 2, 4"),
    (6, 2, "1"),
])
def test_a_split_libtpu_does_not_make_is_refused_naming_what_works(tmp_path, num_chips,
                                                                   num_processes, works):
    done = tpu_launch(tmp_path, chips(tmp_path, num_chips), f"cluster.num_processes={num_processes}",
                      dry_run=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cluster.num_processes: " in done.stderr
    assert f"use num_processes {works}" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


def test_numbered_vfio_entries_are_chips_and_the_control_file_is_not(tmp_path):
    folder = tmp_path / "vfio"
    folder.mkdir()
    for name in ("0", "1", "2", "3", "vfio"):
        (folder / name).write_text("")
    done = tpu_launch(tmp_path, str(folder / "*"))
    assert done.returncode == 0, done.stderr
    assert "devices: 4 TPU chips found" in done.stdout and "vfio/vfio" not in done.stdout.split("\n")[0]


def test_no_chip_on_this_machine_is_bad_input(tmp_path):
    done = tpu_launch(tmp_path, str(tmp_path / "nothing*"), dry_run=False)
    assert done.returncode == 2
    assert "cluster.platform: tpu, but no TPU chip was found on this machine" in done.stderr
    assert "Traceback" not in done.stderr


def test_auto_picks_the_chips_it_finds_and_the_cpu_without(tmp_path):
    pattern = chips(tmp_path, 4)
    done = launch("jobs/linear.yaml", "--dry-run", "--set", "cluster.platform=auto",
                  "--set", f"cluster.tpu_device_paths=[{pattern!r}]",
                  "--set", "cluster.num_processes=null", "--set", "cluster.devices_per_process=null")
    assert done.returncode == 0 and "devices: 4 TPU chips found" in done.stdout, done.stderr
    done = launch("jobs/linear.yaml", "--dry-run", "--set", "cluster.platform=auto",
                  "--set", f"cluster.tpu_device_paths=[{str(tmp_path / 'none*')!r}]",
                  "--set", f"cluster.gpu_device_paths=[{str(tmp_path / 'none*')!r}]")
    assert done.returncode == 0 and "devices: CPU, 2 devices per process" in done.stdout


def test_gpus_default_to_one_process_each(tmp_path):
    pattern = chips(tmp_path, 4, "nvidia", extra=("nvidiactl", "nvidia-uvm"))
    done = launch("jobs/linear.yaml", "--dry-run", "--set", "cluster.platform=gpu",
                  "--set", f"cluster.gpu_device_paths=[{pattern!r}]",
                  "--set", "cluster.num_processes=null", "--set", "cluster.devices_per_process=null")
    assert done.returncode == 0, done.stderr
    assert "devices: 4 GPUs found" in done.stdout
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs(done.stdout)] == ["0", "1", "2", "3"]


def test_each_process_gets_the_gpus_its_device_files_name_in_pci_order(tmp_path):
    # a report: files nvidia4, nvidia5 gave CUDA_VISIBLE_DEVICES 0 and 1 (GPUs the run was
    # never given); CUDA's own order is fastest first, the driver's (and the files') PCI order
    folder = tmp_path / "dev"
    folder.mkdir()
    for name in ("nvidia4", "nvidia5", "nvidiactl", "nvidia-uvm"):
        (folder / name).write_text("")
    done = launch("jobs/linear.yaml", "--dry-run", "--set", "cluster.platform=gpu",
                  "--set", f"cluster.gpu_device_paths=[{str(folder / 'nvidia*')!r}]",
                  "--set", "cluster.num_processes=2", "--set", "cluster.devices_per_process=null")
    assert done.returncode == 0, done.stderr
    assert [(e["CUDA_VISIBLE_DEVICES"], e["CUDA_DEVICE_ORDER"]) for e in envs(done.stdout)] == \
        [("4", "PCI_BUS_ID"), ("5", "PCI_BUS_ID")]


def test_a_shells_cuda_visible_devices_is_split_among_the_processes_never_widened(tmp_path):
    # a scheduler's allocation (CUDA_VISIBLE_DEVICES=2,3 on a 4-GPU box) gave 4 processes
    # GPUs 0-3 without a word
    pattern = chips(tmp_path, 4, "nvidia")
    gpu = ("jobs/linear.yaml", "--dry-run", "--set", "cluster.platform=gpu",
           "--set", f"cluster.gpu_device_paths=[{pattern!r}]",
           "--set", "cluster.devices_per_process=null")
    done = launch(*gpu, "--set", "cluster.num_processes=null", CUDA_VISIBLE_DEVICES="2,3")
    assert done.returncode == 0, done.stderr
    assert "this shell's CUDA_VISIBLE_DEVICES=2,3 gives the run 2 GPUs" in done.stdout
    # each entry means what it meant in the shell: CUDA's default order, as there
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs(done.stdout)] == ["2", "3"]
    assert all("CUDA_DEVICE_ORDER" not in e for e in envs(done.stdout))
    done = launch(*gpu, "--set", "cluster.num_processes=1", CUDA_VISIBLE_DEVICES="GPU-aaa,GPU-bbb",
                  CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert done.returncode == 0, done.stderr
    assert [(e["CUDA_VISIBLE_DEVICES"], e["CUDA_DEVICE_ORDER"]) for e in envs(done.stdout)] == \
        [("GPU-aaa,GPU-bbb", "PCI_BUS_ID")]
    done = launch(*gpu, "--set", "cluster.num_processes=4", CUDA_VISIBLE_DEVICES="2,3")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert "cluster.num_processes: 4 processes x 1 GPU need more than the 2 GPUs of this " \
           "shell's CUDA_VISIBLE_DEVICES (2,3); use at most 2 in all" in done.stderr


NVML = os.path.join(REPO, "tests", "harness", "nvml")  # the stand-in pynvml


def _gpu_dry_run(tmp_path, pattern, driver=None):
    """The dry run of a 2-process gpu job over stand-in device files; ``driver``: what the
    stand-in NVML reports (None: no NVML at all)."""
    env = {"PYTHONPATH": os.pathsep.join([NVML, REPO]) if driver is not None else None}
    if driver is not None:
        (tmp_path / "nvml.json").write_text(json.dumps({"gpus": driver}))
        env["PODLAUNCH_TEST_NVML"] = str(tmp_path / "nvml.json")
    return launch("jobs/linear.yaml", "--dry-run", "--set", "cluster.platform=gpu",
                  "--set", f"cluster.gpu_device_paths=[{pattern!r}]", "--set",
                  "cluster.num_processes=2", "--set", "cluster.devices_per_process=null", **env)


def _gpu(minor, processes=()):
    return {"minor": minor, "uuid": f"GPU-{minor}aaa-bbbb", "name": "NVIDIA H200",
            "total": 140 * 2**30, "processes": [{"pid": p, "used": u} for p, u in processes]}


def test_a_process_holding_only_a_gpus_file_is_no_tenant_the_drivers_list_decides(tmp_path):
    # nvidia-persistenced, Xorg, monitoring agents hold /dev/nvidia* for good: every gpu
    # launch there was refused (NVIDIA gpu-operator #118)
    pattern = chips(tmp_path, 2, "nvidia")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "dev" / "nvidia0")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        done = _gpu_dry_run(tmp_path, pattern, driver=[_gpu(0), _gpu(1)])
        assert done.returncode == 0, done.stdout + done.stderr
        assert "in use" not in done.stdout + done.stderr and "other process" not in done.stdout
        # the GPUs as the driver names them, each process its own
        assert "GPU 0 (NVIDIA H200, GPU-0aaa-bbbb), GPU 1 (NVIDIA H200, GPU-1aaa-bbbb)" in done.stdout
        # the driver lists the holder as a compute process with 100 GiB: said, with what to do
        done = _gpu_dry_run(tmp_path, pattern, driver=[_gpu(0, [(holder.pid, 100 * 2**30)]),
                                                       _gpu(1)])
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(rf"GPU 0 \(NVIDIA H200, GPU-0aaa-bbbb\): 1 other process hold 102,400 of "
                         rf"its 143,360 MiB: pid {holder.pid} \(.*\) 102,400 MiB; JAX preallocates "
                         r"75% of it at start, which is more than is free: wait for them to end, "
                         r"stop them, or set cluster.env.XLA_PYTHON_CLIENT_MEM_FRACTION", done.stdout), \
            done.stdout
        assert holder.poll() is None  # never signalled
    finally:
        holder.kill()
        holder.wait()


def test_without_nvml_the_gpus_tenants_are_said_unchecked(tmp_path):
    done = _gpu_dry_run(tmp_path, chips(tmp_path, 2, "nvidia"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "GPUs: which processes use them was not checked: pynvml (pip install nvidia-ml-py) " \
           "is not installed" in done.stdout, done.stdout


HOLD = textwrap.dedent("""
    import sys, time
    files = [open(p) for p in sys.argv[1:]]
    print("holding", flush=True)
    time.sleep(120)
""")


@pytest.mark.parametrize("held", ["accel2", "libtpu_lockfile"])
def test_a_process_holding_the_chips_is_named_and_nothing_starts(tmp_path, held):
    pattern = chips(tmp_path, 4)
    path = tmp_path / "dev" / held if held.startswith("accel") else tmp_path / held
    path.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        for dry_run in (True, False):
            done = tpu_launch(tmp_path, pattern, dry_run=dry_run)
            assert done.returncode == 1, done.stdout + done.stderr
            assert f"the TPU is in use: pid {holder.pid} (" in done.stderr
            assert str(path) in done.stderr and f"kill {holder.pid}" in done.stderr
            assert "Traceback" not in done.stderr
            assert not (tmp_path / "run" / "logs").exists()  # nothing started
        assert holder.poll() is None and path.exists()  # never stopped, nothing removed
    finally:
        holder.kill()
        holder.wait()
    assert tpu_launch(tmp_path, pattern).returncode == 0  # free again


# A machine that allows no TCP or UDP socket at all (the TPU test machine, sandboxes): every
# AF_INET/AF_INET6 socket fails as the kernel makes it fail there (EAFNOSUPPORT; EPERM under a
# seccomp filter), in the launcher and in every worker (harness.nosockets).
@pytest.mark.slow
def test_a_job_of_one_process_runs_where_no_tcp_socket_can_be_opened(tmp_path):
    done = subprocess.run(LAUNCH + ["jobs/linear.yaml", "--set", "cluster.num_processes=1",
                                    "--set", "train.num_steps=20", "--run-dir", str(tmp_path / "run")],
                          cwd=REPO, env=no_socket_env(tmp_path), capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no coordinator (one process)" in done.stdout
    assert (tmp_path / "run" / "params.npz").exists()


def test_a_job_of_one_process_leaves_a_coordinator_port_unused(tmp_path):
    """A tester's report: a job of one process with ``cluster.coordinator_port`` set still
    needed a socket (exit 1 where none opens, saying both that it needs a port and that it
    needs none), was refused when the port was in use, and claimed a coordinator it never
    started. One process joins no coordinator, whatever the port says."""
    import socket

    sets = ["--set", "cluster.num_processes=1", "--set", "cluster.coordinator_port=23456"]
    done = subprocess.run(LAUNCH + ["jobs/linear.yaml", *sets, "--dry-run"], cwd=REPO,
                          env=no_socket_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "coordinator_address 127.0.0.1:0" in done.stdout, done.stdout
    with socket.socket() as held:  # the port in use here
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        busy = launch("jobs/linear.yaml", "--set", "cluster.num_processes=1", "--set",
                      f"cluster.coordinator_port={port}", "--set", "train.num_steps=5",
                      "--run-dir", str(tmp_path / "run"))
    assert busy.returncode == 0, busy.stdout + busy.stderr
    assert (f"no coordinator (one process; cluster.coordinator_port {port} unused)"
            in busy.stdout), busy.stdout


@pytest.mark.slow
def test_a_program_of_one_process_runs_where_no_tcp_socket_can_be_opened(tmp_path):
    """A program job of one process got a coordinator port it never uses (its
    ``initialize`` joins no jax.distributed for one process), so it failed where no socket
    opens; and its log said "process 0/1 joined" a coordinator that never ran."""
    env = no_socket_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], os.path.join(REPO, "tests", "programs")])
    done = subprocess.run(LAUNCH + ["jobs/seed_program.yaml", "--set", "cluster.num_processes=1",
                                    "--run-dir", str(tmp_path / "run")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no coordinator (one process)" in done.stdout, done.stdout
    log = (tmp_path / "run" / "logs" / "process-000.log").read_text()
    assert "one process, in-process collectives (no jax.distributed)" in log and "joined" not in log


@pytest.mark.parametrize("errno_name", sorted(SAID))
@pytest.mark.parametrize("sets", [(), ("cluster.coordinator_port=23456",)])
def test_a_coordinator_that_cannot_open_a_socket_is_a_sentence(tmp_path, sets, errno_name):
    # EPERM on a fixed port was "port 23456 is in use (Operation not permitted)", exit 2: only
    # EADDRINUSE is in use; any errno of socket() says no socket can be had, with its meaning
    args = ["jobs/linear.yaml", "--run-dir", str(tmp_path / "run")]
    for item in sets:
        args += ["--set", item]
    done = subprocess.run(LAUNCH + args, cwd=REPO, env=no_socket_env(tmp_path, errno_name),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "launch: the JAX coordinator of a job of 2 processes needs a TCP port on 127.0.0.1, " \
           f"and this machine allows no TCP socket ({SAID[errno_name]})" in done.stderr
    assert "in use" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "logs").exists()


def test_a_coordinator_on_a_host_whose_loopback_is_down_is_refused_at_once(tmp_path):
    # unshare -n: sockets open and bind, 127.0.0.1 is unreachable. The workers waited out
    # distributed.initialization_timeout_s, then the summary blamed firewalls
    done = subprocess.run(loopback_down() + LAUNCH + [
        "jobs/linear.yaml", "--set", "train.num_steps=20",
        "--set", "distributed.initialization_timeout_s=20", "--run-dir", str(tmp_path / "run")],
        cwd=REPO, env=env_for_tests(), capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"launch: the JAX coordinator of a job of 2 processes at 127\.0\.0\.1:\d+ "
                     r"cannot be reached from this host \(Network is unreachable, errno 101\): "
                     r"the loopback interface is down", done.stderr), done.stderr
    assert "Traceback" not in done.stderr and "firewall" not in done.stderr
    assert not (tmp_path / "run" / "logs").exists()


@pytest.mark.parametrize("errno_name", sorted(SAID))
def test_a_tpu_split_that_needs_ports_where_none_can_be_opened_is_a_sentence(tmp_path, errno_name):
    pattern = chips(tmp_path, 4)
    done = subprocess.run(LAUNCH + ["jobs/linear.yaml", "--dry-run", "--set", "cluster.platform=tpu",
                                    "--set", f"cluster.tpu_device_paths=[{pattern!r}]",
                                    "--set", f"cluster.libtpu_lockfile={tmp_path / 'lock'}"],
                          cwd=REPO, env=no_socket_env(tmp_path, errno_name), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "libtpu, to split the chips among processes, needs a TCP port on 127.0.0.1, and " \
           f"this machine allows no TCP socket ({SAID[errno_name]})" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_rehearse_runs_a_tpu_split_on_cpu_devices(tmp_path):
    done = launch(
        "jobs/linear.yaml", "--rehearse", "--set", "cluster.platform=tpu",
        "--set", f"cluster.tpu_device_paths=[{chips(tmp_path, 4)!r}]",
        "--set", "cluster.num_processes=2", "--set", "cluster.devices_per_process=null",
        "--set", "train.num_steps=20", "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 processes x 2 CPU devices" in done.stdout
    # the start line says what is rehearsed, not the cpu platform's debug mode
    assert "(rehearsal on CPU devices of a tpu run; 4 TPU chips found on this machine)" in done.stdout
    assert "single-host debug mode" not in done.stdout
    log = (tmp_path / "run" / "logs" / "process-000.log").read_text()
    assert "2 cpu devices" in log


def test_the_ports_of_a_tpu_split_are_distinct_from_each_other_and_the_coordinator(monkeypatch):
    from launcher import proctl
    from launcher.backends import local
    # free_port as it can be: a port free a moment ago, picked again by the next call
    picks = iter([7001, 7001, 7002, 7000, 7002, 7003] * 1000)
    monkeypatch.setattr(proctl, "free_port", lambda host="": next(picks))
    assert local.free_ports(3, "127.0.0.1", taken=(7000,)) == (7001, 7002, 7003)
    monkeypatch.undo()
    for _ in range(300):  # the real picks: 8 ports, never two alike, never the coordinator's
        ports = local.free_ports(8, local.HOST, taken=(7000,))
        assert len(set(ports)) == 8 and 7000 not in ports


def fake_job(tmp_path, platform: str, num_chips: int, num_processes: int, **cluster):
    """What ``local.placements`` reads of a job, for ``num_chips`` chips of ``platform``."""
    from types import SimpleNamespace
    return SimpleNamespace(
        cluster=SimpleNamespace(env=cluster.get("env", {}),
                                chips=tuple(f"/dev/accel{i}" for i in range(num_chips)),
                                gpus=tuple(str(i) for i in range(num_chips)),
                                gpu_order="PCI_BUS_ID"),
        num_processes=num_processes, local_device_count=cluster.get("per", num_chips // num_processes),
        working_directory=None)


@pytest.mark.parametrize("platform,num_chips,num_processes,per", [
    ("tpu", 4, 1, 4), ("tpu", 4, 2, 2), ("tpu", 8, 8, 1), ("gpu", 2, 1, 1), ("gpu", 2, 1, 2),
    ("gpu", 4, 2, 2)])
def test_every_placement_on_chips_drops_the_chip_variables_of_the_shell(tmp_path, platform,
                                                                        num_chips, num_processes, per):
    from launcher.backends import local
    from launcher.backends.local import devices as localdevices
    job = fake_job(tmp_path, platform, num_chips, num_processes, per=per)
    found = local.placements(job, str(tmp_path), sys.executable, platform, taken_ports=(7000,))
    for i, placement in enumerate(found):
        # a JAX_PLATFORMS=cpu exported is not kept either: tpu is named, gpu is JAX's pick
        assert set(placement.unset) == set(localdevices.DEVICE_VARS[platform]) | {"JAX_PLATFORMS"}
        assert placement.env.get("JAX_PLATFORMS") == ("tpu" if platform == "tpu" else None)
        if platform == "gpu":  # even one process: its GPUs, not every one
            first = i * per
            assert placement.env["CUDA_VISIBLE_DEVICES"] == ",".join(
                str(g) for g in range(first, first + per))
        elif num_processes > 1:
            assert "7000" not in placement.env["TPU_PROCESS_ADDRESSES"]
    assert local.placements(job, str(tmp_path), sys.executable, "cpu")[0].unset == ()


def test_a_worker_does_not_inherit_the_chip_variables_its_plan_decides(tmp_path, monkeypatch):
    from launcher.backends.local.worker import LocalWorker
    from launcher.plan import ProcessPlan
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("PODLAUNCH_TEST_KEPT", "yes")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    show = "import os; print([os.environ.get(k) for k in ('TPU_VISIBLE_CHIPS', " \
           "'CUDA_VISIBLE_DEVICES', 'PODLAUNCH_TEST_KEPT', 'JAX_PLATFORMS')])"
    plan = ProcessPlan(process_id=0, host="localhost", local_device_count=1,
                       env={"CUDA_VISIBLE_DEVICES": "1"},
                       argv=(sys.executable, "-c", show), log_path=str(tmp_path / "log"),
                       python=sys.executable, run_dir=str(tmp_path),
                       unset=("TPU_VISIBLE_CHIPS", "CUDA_VISIBLE_DEVICES", "JAX_PLATFORMS"))
    worker = LocalWorker(plan)
    lines = [line for line in worker.lines() if line.startswith("[")]
    assert lines == ["[None, '1', 'yes', None]"]


@pytest.mark.parametrize("platform,name", [("tpu", "TPU_VISIBLE_CHIPS"), ("tpu", "CLOUD_TPU_TASK_ID"),
                                           ("gpu", "CUDA_VISIBLE_DEVICES")])
def test_a_chip_variable_in_cluster_env_is_bad_input(tmp_path, platform, name):
    paths = "tpu_device_paths" if platform == "tpu" else "gpu_device_paths"
    pattern = chips(tmp_path, 4, "accel" if platform == "tpu" else "nvidia")
    done = launch("jobs/linear.yaml", "--dry-run", "--set", f"cluster.platform={platform}",
                  "--set", f"cluster.{paths}=[{pattern!r}]", "--set", "cluster.num_processes=2",
                  "--set", "cluster.devices_per_process=null",
                  "--set", f"cluster.libtpu_lockfile={tmp_path / 'lock'}",
                  "--set", f"cluster.env.{name}=0", "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"cluster.env.{name}: {name!r} is set by podlaunch itself for every process of a " \
           f"{platform} run" in done.stderr
    assert "remove it" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


def test_fewer_gpus_than_the_machine_has_are_said_and_made_visible(tmp_path):
    pattern = chips(tmp_path, 2, "nvidia")
    done = launch("jobs/linear.yaml", "--dry-run", "--set", "cluster.platform=gpu",
                  "--set", f"cluster.gpu_device_paths=[{pattern!r}]",
                  "--set", "cluster.num_processes=1", "--set", "cluster.devices_per_process=1")
    assert done.returncode == 0, done.stderr
    assert "one process gets every one" not in done.stdout
    assert "devices: 2 GPUs found on this machine" in done.stdout and "1 GPU per process" in done.stdout
    assert "1 process x 1 device" in done.stdout
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs(done.stdout)] == ["0"]


def cluster_file(tmp_path, *lines: str) -> str:
    """jobs/linear.yaml with its cluster's num_processes and devices_per_process replaced by
    ``lines``; returns its path."""
    with open(os.path.join(REPO, "jobs", "linear.yaml")) as f:
        text = f.read()
    text = re.sub(r"\n  num_processes: .*\n  devices_per_process: .*", "\n" + "\n".join(
        "  " + line for line in lines), text)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


def test_devices_per_process_alone_on_gpus_derives_the_processes(tmp_path):
    pattern = chips(tmp_path, 2, "nvidia")
    path = cluster_file(tmp_path, "platform: gpu", f"gpu_device_paths: [{pattern!r}]",
                        "devices_per_process: 2")
    done = launch(path, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "1 process x 2 devices" in done.stdout
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs(done.stdout)] == ["0,1"]
    path = cluster_file(tmp_path, "platform: gpu", f"gpu_device_paths: [{pattern!r}]",
                        "devices_per_process: 3")
    done = launch(path, "--dry-run")
    assert done.returncode == 2
    # the key the user set, at its line; not num_processes, which they did not
    with open(path) as f:
        line = 1 + f.read().splitlines().index("  devices_per_process: 3")
    assert f"{path}:{line}: cluster.devices_per_process: 1 process x 3 GPUs need more than the " \
           "2 GPUs found; use at most 2 in all (devices_per_process 2 or less)" in done.stderr
    assert "cluster.num_processes" not in done.stderr


@pytest.mark.parametrize("num_chips,num_processes,works", [
    (4, 3, "use num_processes 1, 2, 4 with devices_per_process 4, 2, 1"),
    (4, 5, "use num_processes 1, 2, 4 with devices_per_process 4, 2, 1"),
    (8, 4, "use num_processes 1, 2, 8 with devices_per_process 8, 4, 1"),
])
def test_a_split_with_devices_per_process_names_the_splits_that_work(tmp_path, num_chips,
                                                                     num_processes, works):
    pattern = chips(tmp_path, num_chips)
    done = tpu_launch(tmp_path, pattern, f"cluster.num_processes={num_processes}",
                      f"cluster.devices_per_process={num_chips // 4 if num_chips == 8 else 1}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert works in done.stderr and "Traceback" not in done.stderr
    for n, per in zip(*(w.split(", ") for w in re.findall(r"\d(?:, \d)*", works.split("use ")[1])[:2])):
        assert tpu_launch(tmp_path, pattern, f"cluster.num_processes={n}",
                          f"cluster.devices_per_process={per}").returncode == 0  # the advice works


def test_a_holder_command_line_with_a_newline_stays_one_line(tmp_path):
    pattern = chips(tmp_path, 4)
    holder = subprocess.Popen([sys.executable, "-c", "\n" + HOLD, str(tmp_path / "dev" / "accel1")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        done = tpu_launch(tmp_path, pattern)
        assert done.returncode == 1
        line, = [l for l in done.stderr.splitlines() if "the TPU is in use" in l]
        assert f"pid {holder.pid} (" in line and "holds " in line and "\\x0aimport sys" in line
    finally:
        holder.kill()
        holder.wait()


def test_an_empty_device_path_list_is_said(tmp_path):
    done = launch("jobs/linear.yaml", "--dry-run", "--set", "cluster.platform=tpu",
                  "--set", "cluster.tpu_device_paths=[]")
    assert done.returncode == 2
    assert "looked for none: cluster.tpu_device_paths is empty" in done.stderr


def test_processes_that_could_not_be_checked_are_said_without_refusing(tmp_path):
    from types import SimpleNamespace
    from launcher.backends.local import devices as localdevices
    pattern = chips(tmp_path, 4)
    held = tmp_path / "dev" / "accel1"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(held)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        cluster = SimpleNamespace(chips=localdevices.device_files([pattern]), resolved_platform="tpu",
                                  libtpu_lockfile=str(tmp_path / "lock"))
        job = SimpleNamespace(cluster=cluster)
        # the holder as another user's process: its files unread, so not refused, but counted
        assert localdevices.check_chips_free(job, unreadable_pids=[holder.pid]) == 1
        text = localdevices.unchecked_text(job, 1)
        assert text.startswith("warning: 1 process of other users could not be checked")
        assert f"sudo lsof {tmp_path / 'dev' / 'accel0'}" in text
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.skipif(os.geteuid() != 0 or not __import__("shutil").which("setpriv"),
                    reason="runs the launcher as user nobody: needs root and setpriv")
def test_a_launch_that_cannot_read_another_users_processes_says_so():
    import pathlib
    import shutil
    import tempfile

    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run(as_nobody + [sys.executable, "-c", "import jax, yaml"], cwd=REPO,
                           env=env_for_tests(), capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:  # e.g. a Python whose shared library sits in root's home
        pytest.skip(f"this interpreter does not run as user nobody: {probe.stderr.strip()[-200:]}")
    tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="podlaunch-nobody-"))  # nobody reads it
    os.chmod(tmp_path, 0o755)
    (tmp_path / "out").mkdir(mode=0o777)
    os.chmod(tmp_path / "out", 0o777)
    pattern = chips(tmp_path, 4)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "dev" / "accel1")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        done = subprocess.run(
            as_nobody + LAUNCH + [
                "jobs/linear.yaml", "--dry-run", "--set", "cluster.platform=tpu",
                "--set", f"cluster.tpu_device_paths=[{pattern!r}]",
                "--set", f"cluster.libtpu_lockfile={tmp_path / 'lock'}",
                "--run-dir", str(tmp_path / "out" / "run")],
            cwd=REPO, env={**env_for_tests(), "HOME": str(tmp_path / "out")}, capture_output=True,
            text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "could not be checked for holding the TPU" in done.stdout + done.stderr
        assert "sudo lsof" in done.stdout + done.stderr
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(tmp_path, ignore_errors=True)

