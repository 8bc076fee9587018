"""Single-host mode on this machine's accelerators (``cluster.platform``), read through ``launch``.

The chips are device files (``cluster.tpu_device_paths``, ``gpu_device_paths``): here real
files in a temporary directory stand for a TPU VM's ``/dev/accel*`` or ``/dev/vfio/N`` and a
GPU box's ``/dev/nvidia*``, counted and checked for holders exactly as the real ones are
(``launcher.backends.localdevices``: globs, then ``/proc/*/fd``). The holders are real
processes with the files open. Every ``launch`` is the real command line.
"""

from __future__ import annotations

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
    log = (tmp_path / "run" / "logs" / "process-000.log").read_text()
    assert "2 cpu devices" in log
