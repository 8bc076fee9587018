"""The slurm backend against a real Slurm: one slurmctld and three slurmd on this machine.

No stand-in: ``tests/harness/slurmenv.py`` starts munged, slurmctld and ``slurmd -N n1..n3``
(Debian's slurm-wlm, installed by .ci/run). Where Slurm cannot start, the tests
fail, they do not skip (set PODLAUNCH_SKIP_SLURM=1 to skip them on purpose).
"""

from __future__ import annotations

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

from harness import sshenv
from harness import detached
from harness.detached import launchers_naming, supervisor, until
from harness.helpers import (LAUNCH, NO_RESTARTS, PACED, REPO, Output, checked_ledger, env_for_tests, launch, pids_with_env, program_job, run_pids,
                     sighup_default, wait_gone)
from harness.runs import SLOW_PROCESS_0, agreed_step, assert_one_agreed_stop, fault
from harness.slurmenv import SlurmTestEnv

pytestmark = pytest.mark.slow
supervisors = detached.supervisors  # a fixture: the detached runs' supervisors, killed at the end

if os.environ.get("PODLAUNCH_SKIP_SLURM") == "1":
    pytest.skip(sshenv.UNAVAILABLE + "PODLAUNCH_SKIP_SLURM=1", allow_module_level=True)

SHORT = ("--set", "train.num_steps=30", "--set", "train.global_batch_size=255",
         "--set", "logging.tensorboard=false")
LONG = ("--set", "train.num_steps=1000000", "--set", "train.global_batch_size=255",
        "--set", "logging.log_every_steps=20", "--set", "logging.tensorboard=false", *NO_RESTARTS,
        *PACED)


def test_the_quick_start_where_slurm_cannot_be_asked_says_why_in_one_line(tmp_path):
    """Issue 70: jobs/clusters/slurm-example.yaml on a machine without Slurm's commands (bad
    input, as platform: gpu where no GPU is: exit 2 at the file's line, nothing run), or with
    them and no configuration (a real sinfo with an empty slurm.conf: its own 'fatal' line,
    exit 1), is said in our words: what failed, what to do, docs/slurm.md; nothing starts."""
    bare = env_for_tests(PATH=os.path.dirname(sys.executable))  # no Slurm command there
    empty = tmp_path / "slurm.conf"
    empty.write_text("")
    configless = env_for_tests(SLURM_CONF=str(empty))
    for env, code, said, end in (
            (bare, 2, "error: jobs/clusters/slurm-example.yaml:5: cluster.backend: slurm, but "
             "sinfo, sbatch, srun, squeue, scontrol, scancel are not on PATH here: run launch on a "
             "login node of your Slurm cluster or inside salloc there", "nothing was started."),
            (configless, 1, "launch: sinfo -h -a failed (sinfo: fatal: Unable to process "
             "configuration file): this machine has no Slurm configuration", "(docs/slurm.md)")):
        result = subprocess.run(LAUNCH + ["jobs/linear.yaml", "--cluster",
                                          "jobs/clusters/slurm-example.yaml", "--dry-run"],
                                cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == code and not result.stdout, result.stdout + result.stderr
        assert result.stderr.startswith(said) and result.stderr.rstrip().endswith(end) and \
            len(result.stderr.splitlines()) == code, result.stderr


@pytest.fixture
def cluster_file(tmp_path):
    def make(**settings) -> str:
        body = {"backend": "slurm", "nodes": 3, "processes_per_node": 1, "devices_per_process": 1,
                "poll_s": 0.2, "grace_s": 2, **settings}
        path = tmp_path / "slurm.yaml"
        path.write_text("".join(f"{k}: {v}\n" for k, v in body.items()))
        return str(path)
    return make


@pytest.fixture(autouse=True)
def clean_queue(request):
    """Every test ends with an empty queue and no process of its runs (checked, then cleaned)."""
    yield
    if "slurm" in request.fixturenames:
        env = request.getfixturevalue("slurm")
        left = env.wait_queue_empty(10)
        if left:
            env.run("scancel", "-u", "root", check=False)
            env.wait_queue_empty(10)
        assert not left, f"jobs left in the queue: {left}"


def slurm_env(env: SlurmTestEnv, **extra) -> dict:
    base = env_for_tests(**extra)
    base = {k: v for k, v in base.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_"))}
    base["SLURM_CONF"] = str(env.conf)
    return base


def run(env, *args, prefix=(), timeout_s=120) -> subprocess.CompletedProcess:
    return subprocess.run(list(prefix) + LAUNCH + list(args), cwd=REPO, env=slurm_env(env),
                          capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)


def start(env, *args) -> subprocess.Popen:
    return subprocess.Popen(LAUNCH + list(args), cwd=REPO, env=slurm_env(env), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=sighup_default)


def read_until(proc, pattern: str, lines: list, timeout_s: float = 90) -> str:
    """Read until a line matches ``pattern``; fails at ``timeout_s`` even if the launcher goes silent.

    ``lines`` becomes everything read so far.
    """
    out = Output.of(proc)
    try:
        return out.wait_for(pattern, timeout_s)
    finally:
        lines[:] = out.lines


def read_rest(proc, lines: list, timeout_s: float) -> None:
    """Read to the launcher's exit (fails at ``timeout_s``); ``lines`` becomes all it printed."""
    out = Output.of(proc)
    try:
        out.finish(timeout_s)
    finally:
        lines[:] = out.lines


def stop_launcher(proc: subprocess.Popen) -> None:
    """Ctrl-C a launcher still running (it cancels its job), killed if it has not exited in 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cmdline(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode().split("\0")[:-1]
    except OSError:
        return []


def params(run_dir) -> list:
    with np.load(os.path.join(run_dir, "params.npz")) as f:
        return [f[k] for k in sorted(f.files)]


# ---- the fixture -----------------------------------------------------------------
def test_the_test_cluster_has_three_idle_nodes(slurm):
    assert slurm.sinfo_states() == {"n1": "idle", "n2": "idle", "n3": "idle"}
    out = slurm.run("srun", "-N3", "-l", "--quiet", "printenv", "SLURMD_NODENAME")
    assert sorted(line.split()[-1] for line in out.splitlines()) == ["n1", "n2", "n3"]


# ---- dry run and bad requests ----------------------------------------------------------
def test_dry_run_prints_script_env_and_devices_and_submits_nothing(slurm, cluster_file, tmp_path):
    cluster = cluster_file(partition="debug", time_limit="00:10:00",
                           sbatch_options="['--comment=podlaunch-test']",
                           env="{API_TOKEN: hunter2}")
    result = run(slurm, "jobs/linear.yaml", "--cluster", cluster, "--dry-run",
                 "--run-dir", str(tmp_path / "run"), *SHORT)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for line in ("#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=1", "#SBATCH --partition=debug",
                 "#SBATCH --time=00:10:00", "#SBATCH --requeue", "#SBATCH --comment=podlaunch-test",
                 "#SBATCH --job-name=podlaunch.linear"):
        assert line in out, out
    assert "expects nodes n1,n2,n3" in out
    assert re.search(r"^p2 n3: host n3, process_id 2", out, re.M), out
    assert "hunter2" not in out and "API_TOKEN=" in out
    assert "JAX_NUM_CPU_DEVICES=1; step: srun '--jobid=<job id>' --nodes=1 --ntasks=1 --nodelist=n3" in out
    assert not slurm.jobs()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("setting,value,says", [
    ("nodes", 5, "cluster.nodes: asks for 5 nodes; partition 'debug' has 3"),
    ("partition", "nope", "cluster.partition: unknown partition 'nope'"),
    ("cpus_per_process", 64, "cluster.cpus_per_process: no node of partition 'debug' fits 1 process per node x 64 CPUs"),
])
def test_an_impossible_request_is_bad_input_before_anything_is_queued(slurm, cluster_file, tmp_path,
                                                                      setting, value, says):
    result = run(slurm, "jobs/linear.yaml", "--cluster", cluster_file(**{setting: value}),
                 "--run-dir", str(tmp_path / "run"), *SHORT)
    assert result.returncode == 2, result.stdout + result.stderr
    assert says in result.stderr, result.stderr
    assert "nothing was started" in result.stderr
    assert not slurm.jobs()


def test_a_fixed_coordinator_port_in_use_on_the_first_node_is_bad_input(slurm, cluster_file, tmp_path):
    """Process 0's own facts line says the port is taken (no probe step): exit 2, job cancelled."""
    with socket.socket() as busy:  # every test node is this machine
        busy.bind(("", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        result = run(slurm, "jobs/linear.yaml", "--cluster", cluster_file(coordinator_port=taken),
                     "--run-dir", str(tmp_path / "run"), *SHORT)
    assert result.returncode == 2, result.stdout + result.stderr
    assert re.search(r"cluster\.coordinator_port: .* on n1; pick another or use 0", result.stderr), \
        result.stderr
    assert not slurm.wait_queue_empty(10)
    assert not wait_gone(str(tmp_path / "run"), 5)


# ---- training: same params as the local run, in an allocation and by submission ---------
@pytest.fixture
def local_params(reference_params):
    """The params of SHORT run uninterrupted on this machine (3 x 1), as ``params`` reads them."""
    run = reference_params(*SHORT, "--set", "cluster.num_processes=3",
                           "--set", "cluster.devices_per_process=1")
    return [run[k] for k in sorted(run)]


@pytest.mark.parametrize("mode", ["submit", "allocation"])
def test_three_nodes_train_to_the_local_params(slurm, cluster_file, tmp_path, local_params, mode):
    run_dir = tmp_path / "run"
    args = ["jobs/linear.yaml", "--cluster", cluster_file(time_limit="'10'"), "--run-dir",
            str(run_dir), *SHORT, "--show", "all"]  # p1's lines on the console too
    # allocation: launch runs inside salloc, which sets SLURM_JOB_ID and many SLURM_* more
    prefix = ["salloc", "-N3", "--quiet"] if mode == "allocation" else []
    result = run(slurm, *args, prefix=prefix)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert f"({mode}) on n1,n2,n3" in out
    # mode auto in the user's allocation: the submitted job's time limit is the user's there
    assert bool(re.search(r"warning: cluster\.time_limit is not used in allocation \d+ "
                          r"\(SLURM_JOB_ID\): only a job podlaunch submits", out)) == (mode == "allocation"), out
    assert re.search(r"^\[p1 n2\] step 30/30 loss", out, re.M), out
    assert ("submitted Slurm job" in out) == (mode == "submit")
    for got, want in zip(params(run_dir), local_params):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert not run_pids(str(run_dir))


def test_a_program_runs_from_its_own_directory_on_every_node(slurm, cluster_file, tmp_path):
    # faulty_program.py is only in tmp_path (the spec file's directory, program.dir), not in
    # the launcher's working directory: srun --chdir must start every step there. A program
    # (not the built-in worker) cannot say its node's facts: a probe step checks the nodes first.
    run_dir = tmp_path / "run"
    result = run(slurm, program_job(tmp_path, steps=10), "--cluster", cluster_file(),
                 "--run-dir", str(run_dir), "--show", "all")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    # the probe picked the port on n1 before the steps started (not 0: not the rendezvous)
    assert re.search(r"\(submit\) on n1,n2,n3, coordinator 127\.0\.0\.1:[1-9]\d*; logs", out), out
    for process_id, node in enumerate(("n1", "n2", "n3")):
        assert re.search(rf"^\[p{process_id} {node}\] step 10/10 loss", out, re.M), out
    assert "OK: 3 processes succeeded" in out
    assert not run_pids(str(run_dir))


def test_a_task_printing_sruns_own_messages_changes_nothing(slurm, cluster_file, tmp_path):
    # srun's own reports (how a task ended, a node failure) are read from srun's stderr only:
    # a task that prints them verbatim (and the ssh wrapper's markers) prints lines like any
    # other, so these processes still succeed, and the task's stderr still reaches its log
    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "p.py").write_text(
        "import os, sys\n"
        "print('srun: error: n1: task 0: Killed', flush=True)\n"
        "print('srun: error: Node failure on n2', flush=True)\n"
        "print('podlaunch-exit code=1 at=1.0', flush=True)\n"
        "print('on stderr', file=sys.stderr, flush=True)\n"
        "print('srun: error: n3: task 0: Exited with exit code 9', file=sys.stderr, flush=True)\n")
    spec = tmp_path / "j.yaml"
    spec.write_text(f"name: forged\nprogram: {{argv: [python, p.py], dir: {prog}}}\n")
    run_dir = tmp_path / "run"
    result = run(slurm, str(spec), "--cluster", cluster_file(), "--run-dir", str(run_dir),
                 "--show", "all")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "OK: 3 processes succeeded" in out
    assert "on stderr" in (run_dir / "logs" / "process-001.log").read_text()
    assert not run_pids(str(run_dir))


# ---- failures and interrupts ---------------------------------------------------------
def test_kill_9_of_one_task_fails_fast_naming_it(slurm, cluster_file, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(slurm, "jobs/linear.yaml", "--cluster", cluster_file(), "--run-dir", str(run_dir), *LONG,
                 "--show", "all")
    lines: list = []
    read_until(proc, r"^\[p1 n2\] step \d+/", lines)
    victims = [p for p in pids_with_env("PODLAUNCH_PROCESS_ID", "1") if p in run_pids(str(run_dir))
               and cmdline(p)[1:4] == ["-P", "-m", "worker"] and "srun" not in cmdline(p)[0]]
    assert len(victims) == 1, victims
    os.kill(victims[0], signal.SIGKILL)
    killed_at = time.monotonic()
    read_rest(proc, lines, 60)
    out = "".join(lines)
    assert proc.returncode == 1, out
    # fail-fast, not the job's end (it has a million steps to go); how fast is for bench/
    assert time.monotonic() - killed_at < 60, out
    summary = out[out.index("FAILED:"):]
    assert summary.startswith("FAILED: process_id 1 on n2 (killed by SIGKILL)"), summary
    assert re.search(r"^p1 +n2 +failed \(first\)", summary, re.M), summary
    assert not slurm.wait_queue_empty(15)  # cancelled: gone once slurmctld has cleaned up
    assert not wait_gone(str(run_dir), 5)


def test_a_python_error_is_not_retried_and_a_sigkill_spends_its_own_budget(slurm, cluster_file,
                                                                           tmp_path):
    """The default budgets on Slurm (issue 26): a Python error in the task is a program error,
    not retried; a SIGKILL of a task on every attempt is an infrastructure fault, retried at
    once under restarts.infrastructure until that budget is spent, and the message names it."""
    faulty = ("--set", "task.name=faulty_task:make", "--set", "task.args.crash_at_step=3",
              "--set", "task.args.crash_process_id=1", "--set", "logging.log_every_steps=1")
    result = run(slurm, "jobs/linear.yaml", "--cluster", cluster_file(), "--run-dir",
                 str(tmp_path / "raise"), *SHORT, *faulty, "--set", "task.args.mode=raise")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert re.search(r"attempt 0 failed: process_id 1 on n\d exited with code 1: a Python error in the "
                     r"job \[program error\]; not retried: a restart repeats it \(restarts\.program_errors is 0\)", out), out
    assert "attempt 1" not in out
    run_dir = tmp_path / "sigkill"
    result = run(slurm, "jobs/linear.yaml", "--cluster", cluster_file(), "--run-dir", str(run_dir),
                 *SHORT, *faulty, "--set", "task.args.mode=sigkill", "--set", "restarts.infrastructure=1",
                 "--set", "restarts.backoff_s=0", timeout_s=240)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    failed = re.findall(r"^podlaunch: attempt (\d) .*failed: process_id 1 on n\d (.*) \[(.*)\]; (.*)$",
                        result.stdout, re.M)
    assert [(n, c) for n, _, c, _ in failed] == [("0", "infrastructure"), ("1", "infrastructure")], out
    assert failed[0][3] == "restarting from the latest checkpoint in 0 s (infrastructure restart 1 of 1)"
    assert failed[1][3] == "not retrying: restarts.infrastructure is 1 and 1 used", out
    assert len(checked_ledger(run_dir)["attempts"]) == 2


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_interrupt_while_running_cancels_the_job(slurm, cluster_file, tmp_path, sig):
    run_dir = tmp_path / "run"
    proc = start(slurm, "jobs/linear.yaml", "--cluster", cluster_file(), "--run-dir", str(run_dir), *LONG)
    lines: list = []
    read_until(proc, r"^\[p\d n\d\] step \d+/", lines)
    proc.send_signal(sig)
    read_rest(proc, lines, 60)
    assert proc.returncode == 130, "".join(lines)
    assert not slurm.wait_queue_empty(5)
    assert not wait_gone(str(run_dir), 5)


def test_a_pending_jobs_launcher_is_live_to_a_second_launch_and_ctrl_c_cancels_the_job(
        slurm, cluster_file, tmp_path):
    # Issue 71: a sweep's second launch, while the first's job pended, refused it as "still
    # queued and their launcher is gone": the first took its run's lock only after the plan,
    # which submits the job and waits for it to run. A path with a space and a quote: sbatch
    # refused it, and scontrol's StdOut, split at the space, named no run directory.
    blocker = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-N3", "--exclusive", "--wrap", "sleep 300").strip()
    try:
        while "RUNNING" not in slurm.run("squeue", "-h", "-j", blocker, "-o", "%T"):
            time.sleep(0.1)
        proc = start(slurm, "jobs/linear.yaml", "--cluster", cluster_file(),
                     "--run-dir", str(tmp_path / "it's a run"), *SHORT)
        lines: list = []
        read_until(proc, r"pending \((Resources|Priority)\)", lines)
        second = run(slurm, "jobs/linear.yaml", "--cluster", cluster_file(), "--dry-run", *SHORT,
                     "--set", "optimizer.learning_rate=0.5")
        assert second.returncode == 0, second.stdout + second.stderr
        assert re.search(r"Slurm job \d+ \(PENDING\) of another launch of 'linear' \(.*/it's a run\) "
                         "has its launcher running: this one runs beside it", second.stdout), \
            second.stdout
        proc.send_signal(signal.SIGINT)
        read_rest(proc, lines, 60)
        assert proc.returncode == 130, "".join(lines)
        assert [j for j in slurm.jobs() if "podlaunch" in j] == []
    finally:
        slurm.run("scancel", blocker)


def test_nohup_launch_with_a_pending_job_survives_the_terminal_closing(slurm, cluster_file, tmp_path):
    # nohup: SIGHUP ignored when the launcher starts. The pending job must not be cancelled
    # when the terminal closes (SIGHUP), and the run must go on to the end once it runs.
    blocker = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-N3", "--exclusive", "--wrap", "sleep 300").strip()
    try:
        while "RUNNING" not in slurm.run("squeue", "-h", "-j", blocker, "-o", "%T"):
            time.sleep(0.1)
        proc = subprocess.Popen(LAUNCH + ["jobs/linear.yaml", "--cluster", cluster_file(),
                                          "--run-dir", str(tmp_path / "run"), *SHORT],
                                cwd=REPO, env=slurm_env(slurm), text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
        lines: list = []
        read_until(proc, r"pending \((Resources|Priority)\)", lines)
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None, "".join(lines)
        assert [j for j in slurm.jobs() if "podlaunch" in j], "the pending job was cancelled"
        slurm.run("scancel", blocker)
        read_rest(proc, lines, 120)
        assert proc.returncode == 0, "".join(lines)
        assert "OK: 3 processes succeeded" in "".join(lines)
    finally:
        slurm.run("scancel", blocker, check=False)


def test_a_sigkilled_launcher_leaves_a_job_the_next_launch_refuses_or_cancels(slurm, cluster_file,
                                                                              tmp_path):
    cluster = cluster_file()
    proc = start(slurm, "jobs/linear.yaml", "--cluster", cluster, "--run-dir", str(tmp_path / "a"), *LONG)
    lines: list = []
    read_until(proc, r"^\[p0 n1\] step \d+/", lines)
    proc.kill()
    proc.wait()
    assert not wait_gone(str(tmp_path / "a"), 10)  # srun got SIGTERM and killed its step
    assert [j.split()[1:] for j in slurm.jobs()] == [["RUNNING", "podlaunch.linear"]]
    again = run(slurm, "jobs/linear.yaml", "--cluster", cluster, "--run-dir", str(tmp_path / "b"), *SHORT)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "are still queued and their launcher is gone; rerun with --kill-stale" in again.stderr
    assert len(slurm.jobs()) == 1
    third = run(slurm, "jobs/linear.yaml", "--cluster", cluster, "--run-dir", str(tmp_path / "c"),
                "--kill-stale", *SHORT)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "cancelling stale Slurm job(s)" in third.stdout


def test_two_launches_of_one_job_run_side_by_side_and_kill_stale_spares_the_live_one(
        slurm, cluster_file, tmp_path):
    # A sweep (submitit #1624): one job, two --set values, launched 3 s apart. The first
    # launch's job shares the second's name, but its launcher runs: it is not stale, and
    # --kill-stale (cancel only jobs whose launcher is gone) must leave it alone.
    cluster = cluster_file(nodes=1)
    slow = ("--set", "task.name=faulty_task:make", "--set", "task.args.sleep_s=0.05",
            "--set", "task.args.slow_process_id=0", "--set", "task.args.slow_attempt=0",
            "--set", "train.num_steps=400", "--set", "train.global_batch_size=255",
            "--set", "logging.log_every_steps=20", "--set", "logging.tensorboard=false")
    first = start(slurm, "jobs/linear.yaml", "--cluster", cluster, "--run-dir", str(tmp_path / "a"),
                  *slow, "--set", "optimizer.learning_rate=0.01")
    lines: list = []
    read_until(first, r"^\[p0 n\d\] step \d+/", lines)
    time.sleep(3)
    second = run(slurm, "jobs/linear.yaml", "--cluster", cluster, "--run-dir", str(tmp_path / "b"),
                 "--kill-stale", *SHORT, "--set", "optimizer.learning_rate=0.5")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "has its launcher running: this one runs beside it" in second.stdout
    assert "cancelling stale" not in second.stdout
    # a first launch says its own seconds alone (its ledger also counts the queue's wait)
    assert re.search(r"^OK: 1 process succeeded in [\d.]+s\.$", second.stdout, re.M), second.stdout
    read_rest(first, lines, 120)
    assert first.returncode == 0, "".join(lines)
    assert re.search(r"OK: 1 process(es)? succeeded", "".join(lines)), "".join(lines)


# ---- preemption -------------------------------------------------------------------------
PREEMPTED_RUN = ("--set", "train.num_steps=300", "--set", "train.global_batch_size=255",
                 "--set", "logging.log_every_steps=10", "--set", "logging.tensorboard=false",
                 "--set", "checkpoint.every_steps=20", "--set", "restarts.max_restarts=2",
                 "--set", "restarts.backoff_s=0")
# The interrupted attempt steps slowly (0.1 s per step: 300 steps take 30 s), so that
# slurmctld's preemption, or its node failure, surely lands before the run could end by
# itself on a loaded machine (at full speed 300 steps take ~1 s); the attempts after it
# run at full speed. The task is the seed's linear one (faulty_task), so the final params
# are those of PREEMPTED_RUN alone.
SLOW_FIRST_ATTEMPT = ("--set", "task.name=faulty_task:make", "--set", "task.args.sleep_s=0.1",
                      "--set", "task.args.slow_process_id=0", "--set", "task.args.slow_attempt=0")


def assert_uninterrupted_params(run_dir, reference_params) -> None:
    """``run_dir``'s final params equal those of the same run, uninterrupted, locally (3 x 1):
    one reference run for the three tests that end there (``reference_params``)."""
    want = reference_params(*PREEMPTED_RUN, "--set", "cluster.num_processes=3",
                            "--set", "cluster.devices_per_process=1")
    got = params(run_dir)
    assert len(got) == len(want)
    for got_leaf, want_leaf in zip(got, [want[k] for k in sorted(want)]):
        np.testing.assert_allclose(got_leaf, want_leaf, rtol=1e-6)


def test_a_preempted_job_is_requeued_and_resumes_to_the_uninterrupted_params(
        slurm, cluster_file, tmp_path, reference_params):
    run_dir = tmp_path / "run"
    proc = start(slurm, "jobs/linear.yaml", "--cluster", cluster_file(), "--run-dir", str(run_dir),
                 *PREEMPTED_RUN, *SLOW_FIRST_ATTEMPT)
    lines: list = []
    read_until(proc, r"^\[p0 n1\] checkpoint of step \d+ saved", lines)
    # a job in the higher-priority partition takes every node: ours gets SIGTERM, then is requeued
    urgent = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-p", "urgent", "-N3", "--exclusive",
                       "--wrap", "sleep 1").strip()
    read_rest(proc, lines, 240)
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert re.search(r"is being preempted|is (REQUEUED|PENDING|PREEMPTED)", out), out
    assert re.search(r"attempt 0 failed: process_id \d on n\d was preempted \(Slurm job \d+ is being "
                     r"preempted.*\[preemption\]; restarting from the latest checkpoint in 0 s "
                     r"\(preemption restart 1 of 100; restart 1 of 2 in all\)", out), out
    assert re.search(r"^\[p0 n1\] resumed from the checkpoint of step \d+", out, re.M), out
    # Slurm's SIGTERM to every task, GraceTime (2 s) before its SIGKILL: one step all
    # processes stopped after, saved, and resumed from (issue 27)
    assert_one_agreed_stop(run_dir, 3, 1)
    assert_uninterrupted_params(run_dir, reference_params)
    assert urgent and not run_pids(str(run_dir))
    # the ledger on Slurm: the requeue's wait (pending until slurmctld starts it again) is
    # the second attempt's launch
    preempted, again = checked_ledger(run_dir)["attempts"]
    assert preempted["buckets_s"]["teardown"] > 0 and again["buckets_s"]["launch"] > 0
    assert again["buckets_s"]["restore"] > 0 and again["resumed_step"] > 0


def resumed_run(slurm, cluster: str, run_dir, interrupt) -> tuple[str, str]:
    """PREEMPTED_RUN by submission, ``interrupt()`` after its first checkpoint; it must resume
    and succeed. Returns (the first Slurm job id, everything the launcher printed)."""
    proc = start(slurm, "jobs/linear.yaml", "--cluster", cluster, "--run-dir", str(run_dir),
                 *PREEMPTED_RUN, *SLOW_FIRST_ATTEMPT)
    lines: list = []
    read_until(proc, r"^\[p0 n1\] checkpoint of step \d+ saved", lines)
    interrupt()
    read_rest(proc, lines, 240)
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert re.search(r"^\[p0 n1\] resumed from the checkpoint of step \d+", out, re.M), out
    return re.search(r"submitted Slurm job (\d+)", out).group(1), out


def test_a_job_preempted_under_preempt_mode_cancel_is_resubmitted_and_resumes(
        slurm, cluster_file, tmp_path, reference_params):
    """PreemptMode=CANCEL (partition ``cancel``): --requeue does nothing, the job ends PREEMPTED."""
    run_dir = tmp_path / "run"
    first, out = resumed_run(slurm, cluster_file(partition="cancel"), run_dir, lambda: slurm.run(
        "sbatch", "--parsable", "-o", "/dev/null", "-p", "urgent", "-N3", "--exclusive",
        "--wrap", "sleep 1"))
    assert f"Slurm job {first} is PREEMPTED: submitting it again" in out, out
    assert re.search(r"attempt 0 failed: .* \[preemption\]; restarting", out), out
    assert len(re.findall(r"submitted Slurm job \d+", out)) == 2, out
    assert_uninterrupted_params(run_dir, reference_params)
    assert not run_pids(str(run_dir))


def test_a_node_failure_is_resubmitted_and_resumes_from_the_checkpoint(slurm, cluster_file, tmp_path,
                                                                     reference_params):
    """A node set DOWN under a running job: Slurm ends it NODE_FAIL (requeue off), podlaunch resubmits."""
    run_dir = tmp_path / "run"
    try:
        first, out = resumed_run(slurm, cluster_file(requeue="false"), run_dir, lambda: slurm.run(
            "scontrol", "update", "nodename=n2", "state=down", "reason=podlaunch-test"))
    finally:
        slurm.wait_idle(60)  # ReturnToService=2: n2's slurmd registers again and it is idle
    assert f"Slurm job {first} is NODE_FAIL: submitting it again" in out, out
    assert re.search(r"was lost \(Slurm job \d+ is NODE_FAIL.*\[infrastructure\]", out), out
    # 3 nodes for 3 tasks: the failed node cannot be excluded (issue 28), and the console says so
    assert re.search(r"^podlaunch: not excluding n2 \(srun reported a node failure on it\): without "
                     r"it Slurm cannot place the job \(.*\); submitting with it$", out, re.M), out
    assert_uninterrupted_params(run_dir, reference_params)
    assert not run_pids(str(run_dir))


def test_a_node_set_down_is_excluded_from_the_resubmission_and_the_run_ends_at_the_same_params(
        slurm, cluster_file, tmp_path, reference_params):
    """Issue 28: 3 nodes for 2 tasks; the second task's node set DOWN mid-run. The job ends
    NODE_FAIL; podlaunch resubmits it with that node excluded (sbatch --exclude), Slurm
    places it on the third node, and the run ends at the uninterrupted 2-process params."""
    run_dir = tmp_path / "run"
    args = ("--set", "train.global_batch_size=256")
    proc = start(slurm, "jobs/linear.yaml", "--cluster", cluster_file(nodes=2, requeue="false"),
                 "--run-dir", str(run_dir), *PREEMPTED_RUN, *SLOW_FIRST_ATTEMPT, *args)
    lines: list = []
    started = read_until(proc, r"as steps of Slurm job \d+ \(submit\) on n\d,n\d", lines)
    down = re.search(r" on n\d,(n\d)", started).group(1)
    read_until(proc, r"^\[p0 n\d\] checkpoint of step \d+ saved", lines)
    try:
        slurm.run("scontrol", "update", f"nodename={down}", "state=down", "reason=podlaunch-test")
        read_rest(proc, lines, 240)
    finally:
        slurm.wait_idle(60)
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert re.search(rf"^podlaunch: {down} excluded from the resubmission \(--exclude\): srun "
                     rf"reported a node failure on it", out, re.M), out
    script_text = (run_dir / "slurm" / "job.sbatch").read_text()
    assert f"#SBATCH --exclude={down}\n" in script_text, script_text
    again = re.findall(r"as steps of Slurm job \d+ \(submit\) on (n\d,n\d)", out)
    assert len(again) == 2 and down not in again[1], out
    assert re.search(rf"Slurm placed the resubmitted job on n\d in the place of {down}", out), out
    change = json.loads((run_dir / "run.json").read_text())["host_changes"]
    assert [(c["host"], c["process_ids"], c["attempt"]) for c in change] == [(down, [1], 1)], change
    want = reference_params(*PREEMPTED_RUN, *args, "--set", "cluster.num_processes=2",
                            "--set", "cluster.devices_per_process=1")
    for got, ref in zip(params(run_dir), [want[k] for k in sorted(want)]):
        np.testing.assert_allclose(got, ref, rtol=1e-6)
    assert not run_pids(str(run_dir))


@pytest.mark.parametrize("lead_s", [0, 30])
def test_a_time_limit_is_named_as_such_and_not_resubmitted(slurm, cluster_file, tmp_path, lead_s):
    """TIMEOUT by Slurm's job state (time_limit 1 minute; Slurm checks limits every 30 s), or
    with a lead (``time_limit_lead_s`` 30, the most a 1-minute limit allows: ``--signal=TERM@30``,
    which Slurm sends up to 60 s early) the limit's notice before it: final either way, one
    agreed step saved."""
    run_dir = tmp_path / "run"
    # paced at 4 steps a second (LONG's 20 made 1,500 steps of three processes in the minute
    # or more Slurm takes: 15 CPU-s of the CI's two cores, for nothing the test looks at)
    result = run(slurm, "jobs/linear.yaml", "--cluster",
                 cluster_file(time_limit="'1'", time_limit_lead_s=lead_s),
                 "--run-dir", str(run_dir), *LONG, "--set", "task.args.sleep_s=0.25",
                 "--set", "checkpoint.every_steps=20",
                 "--set", "restarts.max_restarts=2", "--set", "restarts.backoff_s=0",
                 timeout_s=240)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    script_text = (run_dir / "slurm" / "job.sbatch").read_text()
    assert ("#SBATCH --signal=TERM@30\n" in script_text) == bool(lead_s), script_text
    # the summary leads with it, as the reason the attempt is not retried
    if lead_s:
        assert re.search(r"^FAILED: process_id \d on n\d \(Slurm job \d+ is \d+ s from its time "
                         r"limit, and its notice \(--signal=TERM@30\) stopped the task \(exit code "
                         r"143\)", out, re.M), out
        assert re.search(r"failed: process_id \d on n\d ended: Slurm job \d+ is \d+ s from its time "
                         r"limit.* raise cluster.time_limit and continue with --resume .*; a "
                         "restart would end the same way", out), out
    else:
        assert re.search(r"^FAILED: process_id \d on n\d \(Slurm job \d+ reached its time limit "
                         r"\(TIMEOUT; task ", out, re.M), out
        assert re.search(r"failed: process_id \d on n\d ended: Slurm job \d+ reached its time limit.* "
                         r"raise cluster.time_limit and continue with --resume .*; a restart would "
                         "end the same way", out), out
    # podlaunch's own lines never call it a preemption nor restart (JAX's abort text in the
    # workers' tails may say "preempted/died/restarted": theirs, not the verdict)
    own = "\n".join(line for line in out.splitlines() if not re.match(r"^\s*(\[?p\d+ |\| )", line))
    assert "preempt" not in own and "restarting" not in own, out
    assert len(re.findall(r"submitted Slurm job \d+", out)) == 1, out
    # Slurm's SIGTERM at the time limit (KillWait before its SIGKILL) is a notice: every
    # process stopped after one step, which process 0 saved for --resume (issue 27)
    assert (run_dir / "checkpoints" / f"step-{agreed_step(run_dir, 3):07d}").is_dir()
    assert not slurm.wait_queue_empty(15)  # cancelled: gone once slurmctld has cleaned up
    assert not wait_gone(str(run_dir), 5)


def test_the_batch_script_ends_the_job_itself_when_its_launcher_is_gone(slurm, cluster_file, tmp_path):
    """A launcher killed with SIGKILL renews no heartbeat: the job ends after orphan_timeout_s."""
    run_dir = tmp_path / "run"
    proc = start(slurm, "jobs/linear.yaml", "--cluster", cluster_file(orphan_timeout_s=30),
                 "--run-dir", str(run_dir), *LONG)
    lines: list = []
    read_until(proc, r"^\[p0 n1\] step \d+/", lines)
    job_id = re.search(r"submitted Slurm job (\d+)", "".join(lines)).group(1)
    proc.kill()
    proc.wait()
    # the launcher's last renewal, moved back past orphan_timeout_s instead of waiting 30 s
    beat = run_dir / "slurm" / "launcher-heartbeat"
    old = time.time() - 31
    os.utime(beat, (old, old))
    assert not slurm.wait_queue_empty(30), "the batch script did not end the job"
    said = (run_dir / "slurm" / f"batch-{job_id}.out").read_text()
    assert re.search(r"podlaunch: no launcher heartbeat for \d+ s: ending the job", said), said
    assert not wait_gone(str(run_dir), 5)


# ---- profiles ------------------------------------------------------------------------
PROFILED = ("--set", "train.num_steps=100", "--set", "train.global_batch_size=255",
            "--set", "logging.tensorboard=false")


def test_launch_profile_reaches_every_task_through_the_shared_run_directory(slurm, cluster_file,
                                                                            tmp_path, reference_params):
    # the request is a file in the run directory the nodes share (SlurmWorker.request_profile)
    run_dir = tmp_path / "run"
    # 0.2 s a step: the request must land before the run ends (at 0.05 s, 90 steps left were
    # 4.5 s, less than `launch profile` took under two CI runs at once: steps 97-100, too late)
    proc = start(slurm, "jobs/linear.yaml", "--cluster", cluster_file(), "--run-dir", str(run_dir),
                 *PROFILED, *SLOW_PROCESS_0, "--set", "task.args.sleep_s=0.2")
    lines: list = []
    try:
        read_until(proc, r"\[p0 n1\] step 10/100", lines, timeout_s=120)
        asked = subprocess.run(LAUNCH + ["profile", str(run_dir), "--steps", "4"], cwd=REPO,
                               env=slurm_env(slurm), capture_output=True, text=True, timeout=90)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        # a task that reads the request past its first step traces its next 4 instead (the
        # worker's profiler says so): under two CI runs at once, "steps 27-30, 31-34 traced by 3"
        session = re.search(r"profile (steps_\d+-\d+): steps \d+-\d+(, \d+-\d+)* traced by 3 processes",
                            asked.stdout)
        assert session, asked.stdout
        read_rest(proc, lines, 300)
    finally:
        stop_launcher(proc)  # a failure above leaves no job for the next test's queue check
    assert proc.returncode == 0, "".join(lines)[-3000:]
    from worker.contract import profiling

    for p in range(3):
        assert os.path.getsize(profiling.trace_path(str(run_dir), session[1], p)) > 10000
    want = reference_params(*PROFILED, "--set", "cluster.num_processes=3",
                            "--set", "cluster.devices_per_process=1")
    for got, expected in zip(params(run_dir), [want[k] for k in sorted(want)]):
        np.testing.assert_allclose(got, expected, rtol=1e-6)


# ---- detached ------------------------------------------------------------------------
def test_a_detached_slurm_run_is_followed_by_name_and_stopped_with_nothing_left(slurm, cluster_file,
                                                                                tmp_path):
    # the supervisor leaves the terminal; `launch wait`, `launch logs` and `launch stop` reach
    # it by its run directory; the stop returns once no task of the job is left and the queue
    # is empty
    run_dir = tmp_path / "run"
    started = run(slurm, "jobs/linear.yaml", "--cluster", cluster_file(), "--run-dir", str(run_dir),
                  *LONG, "--detach", timeout_s=300)
    assert started.returncode == 0, started.stdout + started.stderr
    pid = json.loads((run_dir / "run.json").read_text())["launcher"]["pid"]
    try:
        deadline = time.monotonic() + 180
        while (json.loads((run_dir / "run.json").read_text()).get("step") or 0) < 40:
            assert time.monotonic() < deadline, "run.json's step did not reach 40"
            time.sleep(0.2)
        assert run_pids(str(run_dir)), "no task of the job trains"
        assert [j.split()[1:] for j in slurm.jobs()] == [["RUNNING", "podlaunch.linear"]]
        assert run(slurm, "wait", str(run_dir), "--timeout", "0.5").returncode == 124
        stopped = run(slurm, "stop", str(run_dir), timeout_s=300)
        left = run_pids(str(run_dir))  # at once: no waiting
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not left, left
        assert not slurm.wait_queue_empty(5)
        assert run(slurm, "wait", str(run_dir)).returncode == 130
        assert "interrupted" in run(slurm, "logs", str(run_dir)).stdout
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


TAKEN_BACK_STEPS = 300
# 2 processes x 2 CPU devices on two nodes, process 0 sleeping 50 ms a step: about 16 s
TAKEN_BACK = ("--set", f"train.num_steps={TAKEN_BACK_STEPS}", "--set", "logging.log_every_steps=20",
              "--set", "logging.tensorboard=false", *PACED)


def _logged_steps(run_dir, process_id: int, steps: int = TAKEN_BACK_STEPS, attempt: str = "") -> list:
    path = run_dir / "logs" / attempt / f"process-{process_id:03d}.log"
    text = path.read_text() if path.exists() else ""
    return [int(s) for s in re.findall(rf" step (\d+)/{steps} loss", text)]


def _kill_supervisor(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    until(lambda: not os.path.exists(f"/proc/{pid}") or
          open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", "the supervisor gone")


def _journal(run_dir) -> dict:
    try:
        return json.loads((run_dir / "supervisor.json").read_text())
    except (OSError, ValueError):
        return {}


def test_a_detached_slurm_runs_killed_supervisor_is_taken_back_in_the_same_job(
        slurm, cluster_file, tmp_path, reference_params, supervisors):
    # the supervisor is SIGKILLed mid-run: the job's steps train on (their srun outlives it,
    # their output in files of the run) and `launch attach` takes them back, in the same job
    run_dir = tmp_path / "run"
    started = run(slurm, "jobs/linear.yaml", "--cluster",
                  cluster_file(nodes=2, devices_per_process=2, orphan_timeout_s=30),
                  "--run-dir", str(run_dir), *TAKEN_BACK, "--detach", timeout_s=300)
    assert started.returncode == 0, started.stdout + started.stderr
    killed = supervisor(run_dir)
    supervisors.append(killed)
    until(lambda: max(_logged_steps(run_dir, 0), default=0) >= 20, "step 20 in process 0's log")
    journal = until(lambda: (lambda j: j if all(w.get("step") for w in j.get("workers") or [{}])
                             else None)(_journal(run_dir)), "the journal naming both steps")
    job_id = journal["session"]["job_id"]
    steps = sorted(w["step"] for w in journal["workers"])
    offset = {w["process_id"]: w["offset"] for w in journal["workers"]}
    _kill_supervisor(killed)
    # nobody watches: the steps train on, and what they print is kept in the run's files
    out = run_dir / "output" / "attempt-0" / "process-000.out"
    until(lambda: out.stat().st_size > offset[0] + 200, "process 0's output growing unwatched")
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    listed = slurm.run("squeue", "-h", "-s", "-j", job_id, "-o", "%i").split()
    assert set(steps) <= set(listed), (steps, listed)
    # the batch script: no heartbeat for orphan_timeout_s (moved back rather than waited), but
    # the run's steps still train, so the job goes on (a foreground run's would end)
    old = time.time() - 31
    os.utime(run_dir / "slurm" / "launcher-heartbeat", (old, old))
    batch = run_dir / "slurm" / f"batch-{job_id}.out"
    until(lambda: "the run's steps train on" in batch.read_text(), "the batch script's check", 30)
    attached = run(slurm, "attach", str(run_dir), timeout_s=240)
    supervisors.extend(launchers_naming(str(run_dir)))
    said = attached.stdout + attached.stderr
    assert attached.returncode == 0, said[-3000:]
    assert "OK: 2 processes succeeded" in said, said[-3000:]
    log = (run_dir / "launcher.log").read_text()
    # the same job goes on: neither submitted again nor cancelled before the run's end
    assert re.findall(r"submitted Slurm job (\d+)", started.stdout + started.stderr) == [job_id]
    assert "submitted Slurm job" not in log + said, log[-3000:]
    assert [p.name for p in (run_dir / "slurm").glob("batch-*.out")] == [f"batch-{job_id}.out"]
    assert re.search(r"taking the run back after \d+\.\d s without a supervisor: attempt 0's 2 "
                     "processes", log), log[-3000:]
    want = reference_params("--set", f"train.num_steps={TAKEN_BACK_STEPS}")
    for got, expected in zip(params(run_dir), [want[k] for k in sorted(want)]):
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded" and record["attempts"] == 1, record
    taken = checked_ledger(run_dir)["attempts"][0]  # the gap a fact; its steps count
    assert taken["unwatched_s"] > 0 and taken["buckets_s"]["unsupervised"] == 0, taken
    for i in range(2):  # every step line once: none lost while nobody read, none twice
        assert _logged_steps(run_dir, i) == list(range(20, TAKEN_BACK_STEPS + 1, 20)), i
    assert "ending the job" not in batch.read_text()
    assert not (run_dir / "supervisor.json").exists()


def test_a_step_that_failed_unwatched_is_classified_and_a_run_killed_in_its_restarts_wait_goes_on_in_the_same_job(
        slurm, cluster_file, tmp_path, reference_params, supervisors):
    # process 1 exits with code 7 after step 40 of attempt 0 while no supervisor watches; the
    # attach classifies it from its holder's report (a program error, restarted), its own
    # supervisor is killed in the restart's 4 s wait, and a second attach restarts the run in
    # the same job
    run_dir, steps = tmp_path / "run", 200
    started = run(slurm, "jobs/linear.yaml", "--cluster", cluster_file(nodes=2, devices_per_process=2),
                  "--run-dir", str(run_dir), "--set", f"train.num_steps={steps}",
                  "--set", "logging.log_every_steps=20", "--set", "logging.tensorboard=false",
                  *PACED, *fault("exit", 40), "--set", "task.args.slow_attempt=0",
                  "--set", "checkpoint.every_steps=20", "--set", "restarts.program_errors=1",
                  "--set", "restarts.backoff_s=4", "--detach", timeout_s=300)
    assert started.returncode == 0, started.stdout + started.stderr
    killed = supervisor(run_dir)
    supervisors.append(killed)
    until(lambda: max(_logged_steps(run_dir, 0, steps), default=0) >= 20, "step 20 in p0's log")
    _kill_supervisor(killed)
    srun = run_dir / "output" / "attempt-0" / "process-001.srun"
    until(lambda: "podlaunch-srun-exit 7" in srun.read_text(), "process 1's end, unwatched")
    first = subprocess.Popen(LAUNCH + ["attach", str(run_dir)], cwd=REPO, env=slurm_env(slurm),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL)
    until(lambda: supervisor(run_dir) != killed, "the first attach's supervisor")
    adopter = supervisor(run_dir)
    supervisors.append(adopter)
    until(lambda: _journal(run_dir).get("waiting"), "the restart's wait")
    _kill_supervisor(adopter)
    first.wait(timeout=60)
    log = (run_dir / "launcher.log").read_text()
    assert re.search(r"attempt 0 failed: process_id 1 .*code 7 \[program error\]; restarting", log), \
        log[-3000:]
    attached = run(slurm, "attach", str(run_dir), timeout_s=240)
    supervisors.extend(launchers_naming(str(run_dir)))
    assert attached.returncode == 0, (attached.stdout + attached.stderr)[-3000:]
    log = (run_dir / "launcher.log").read_text()
    assert "submitted Slurm job" not in log and len(list((run_dir / "slurm").glob("batch-*.out"))) == 1
    want = reference_params("--set", f"train.num_steps={steps}")
    for got, expected in zip(params(run_dir), [want[k] for k in sorted(want)]):
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded" and record["attempts"] == 2, record
    assert record["failures"] == {"program error": 1}, record
    assert max(_logged_steps(run_dir, 0, steps, "attempt-1")) == steps
    entry = checked_ledger(run_dir)["attempts"][0]
    failed = entry["buckets_s"]  # the wait's unwatched part (nothing ran) is badput; before
    # it, the attempt's own gap (its steps ran, one failed) is a fact beside the buckets
    assert failed["unsupervised"] > 0 and failed["restart_wait"] + failed["unsupervised"] >= 3.99, failed
    assert entry["unwatched_s"] > failed["unsupervised"], entry
