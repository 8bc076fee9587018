"""Surviving failures end to end: restarts from checkpoints, --resume, the stall watchdog.

Real JAX processes (2 processes x 1 CPU device), the real CLI, real sshd hosts
for the ssh case. The fault fires on attempt 0 only (``first_attempt_fault``),
so a restarted run can finish.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from harness import helpers
from harness.helpers import (KINDS, LAUNCH, PROGRAMS, REPO, checked_ledger, env_for_tests, launch,
                             launched, logged_steps,
                             pids_with_env, program_job, read_scalars)
from harness.runs import (agreed_step, assert_one_agreed_stop, assert_same_params, fault, params,
                          remote_run_dir, ssh_cluster)
from launcher import logtimes

pytestmark = pytest.mark.slow

STEPS = 40
# Attempt 0's steps take 60 ms (process 0 sleeps, the others wait for it in the all-reduce):
# the local tier's writer thread gets a few hundred ms per copy before a fault at step 17,
# as it would beside real steps, and 5 steps are 0.3 s, more than the 0.25 s the tier keeps
# between copies (worker.recovery.localtier.MIN_INTERVAL_S). With the seed's 3 ms steps, steps
# 5 to 17 took 40 ms, and on a loaded CI machine no copy was finished when process 0 died
# (resumed from step 0).
WRITER_TIME = ("--set", "task.args.sleep_s=0.06", "--set", "task.args.slow_process_id=0",
               "--set", "task.args.slow_attempt=0")

COMMON = ("--set", f"train.num_steps={STEPS}", "--set", "cluster.devices_per_process=1",
          "--set", "logging.log_every_steps=5", "--set", "checkpoint.every_steps=5",
          "--set", "restarts.backoff_s=0.2")


@pytest.fixture
def uninterrupted(reference_params):
    return reference_params(*COMMON)


@pytest.mark.parametrize("parallelism", ["pmap", "jit"])
def test_worker_killed_at_step_k_restarts_and_matches_the_uninterrupted_run(tmp_path, uninterrupted,
                                                                            parallelism,
                                                                            own_compilation_cache):
    # jit: its checkpoints and resume give pmap's uninterrupted params too
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", *COMMON, *fault("sigkill", 17), "--set", "restarts.max_restarts=1",
                    "--set", f"train.parallelism={parallelism}", "--run-dir", str(run_dir))
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr
    assert_same_params(params(run_dir), uninterrupted)
    # every attempt in the console ...
    assert "podlaunch: attempt 0: starting 2 processes" in out
    # a SIGKILL is an infrastructure fault: the first one restarts at once, not after backoff_s
    assert re.search(r"attempt 0 failed: process_id 1 on localhost was killed by SIGKILL \(no notice: "
                     r"the OOM killer, a preemption without one, or a crash\) \[infrastructure\]; "
                     r"restarting from the latest checkpoint in 0 s \(infrastructure restart 1 of 10; "
                     r"restart 1 of 1 in all\)", out), out
    assert ("podlaunch: attempt 1 (infrastructure restart 1 of 10; restart 1 of 1 in all): "
            "starting 2 processes") in out
    assert re.search(r"^\[p0\] resumed from the checkpoint of step 15 \(attempt 1\) in [0-9.]+ s$", out, re.M), out
    # the default view: process 1's progress lines are in its log only
    assert not re.search(r"^\[p1\] step \d+/", out, re.M), out
    # ... in the logs, one file per process per attempt ...
    logs = run_dir / "logs"
    assert sorted(os.listdir(logs)) == ["attempt-1", "process-000.log", "process-001.log"]
    assert sorted(os.listdir(logs / "attempt-1")) == ["process-000.log", "process-001.log"]
    assert "injecting sigkill at step 17" in (logs / "process-001.log").read_text()
    second = logtimes.read_text(logs / "attempt-1" / "process-001.log")
    # the ledger: the crash's teardown, the restore, and the steps trained again as the logs
    # show them (attempt 0 logged up to its last step line; attempt 1 resumed from step 15)
    ledger = checked_ledger(run_dir)
    first, again = ledger["attempts"]
    # the crash's end is teardown, never shutdown. A save is taken out of the stretch its line
    # arrived in: on a loaded machine process 0's last save line came after its last progress
    # line, and its seconds emptied the teardown (0.0 in a CI run beside two busy loops)
    assert first["buckets_s"]["shutdown"] == 0
    assert first["buckets_s"]["teardown"] + first["buckets_s"]["checkpoint"] > 0
    assert again["buckets_s"]["restore"] > 0 and again["resumed_step"] == 15
    logged = max(logged_steps(logs / f"process-00{i}.log") for i in range(2))
    assert again["steps_again"] == logged - 15 == ledger["run"]["steps_again"], ledger
    assert re.search(r"^resumed from the checkpoint of step 15 \(attempt 1\) in [0-9.]+ s$",
                     second, re.M)
    # the restart's process 0 loads what attempt 0 compiled (the run's compilation cache;
    # JAX writes from process 0 only, and process 1's executables, on other devices, have
    # other keys: it compiles again), and every process says what it found
    assert re.search(r"^compilation cache: 0 hits, [1-9]\d* misses", logtimes.read_text(logs / "process-000.log"),
                     re.M)
    assert re.search(r"^compilation cache: [1-9]\d* hits, \d+ misses",
                     logtimes.read_text(logs / "attempt-1" / "process-000.log"), re.M)
    assert re.search(r"^compilation cache: \d+ hits, \d+ misses", second, re.M)
    assert "step 40/40" in second and "step 10/40" not in second and "heartbeat" not in second
    # ... and in the final summary
    summary = out[out.index("attempts: 2 (1 restart)"):]
    assert "killed by SIGKILL (no notice: the OOM killer, a preemption without one, or a crash) " \
        "[infrastructure]; retried after 0 s" in summary
    # each attempt's compilation, from every process's cache line: attempt 1 found entries
    compiled = re.findall(r"^ +compilation: first step up to \d+\.\d{3} s \(p[01]\); cache (\d+) "
                          r"hits?, (\d+) miss(?:es)? over 2 processes$", summary, re.M)
    assert len(compiled) == 2 and compiled[0][0] == "0" and int(compiled[1][0]) > 0, summary
    assert re.search(r"attempt 1 +last step 40 .*attempt-1\n +succeeded", summary), summary
    # TensorBoard: the earlier event file stays; the curve continues to the end
    # the workers' event files (the launcher's goodput ledger, "*.goodput", is its own)
    events = sorted(n for n in os.listdir(run_dir / "tensorboard")
                    if n.startswith("events.out") and not n.endswith(".goodput"))
    assert len(events) == 2, events
    loss = read_scalars(str(run_dir / "tensorboard"))["loss"]
    assert sorted({step for step, _ in loss}) == list(range(5, STEPS + 1, 5))
    by_step: dict = {}
    for step, value in loss:  # step 15 was logged by both attempts: the same value
        by_step.setdefault(step, []).append(value)
    assert all(np.allclose(v, v[0], rtol=1e-6) for v in by_step.values())
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["step-0000030", "step-0000035", "step-0000040"]


CACHE_LINE = (r"^\[p0\] compilation cache: (\d+) hits, (\d+) misses; first step \(trace, compile, "
              r"dispatch\) \d+\.\d{3} s \((.+)\)$")
SUMMARY_CACHE = (r"^ *compilation: first step up to \d+\.\d{3} s \(p[01]\); cache (\d+) hits?, "
                 r"(\d+) miss(?:es)? over 2 processes$")


def test_a_rerun_of_a_job_loads_what_the_earlier_run_compiled(tmp_path, own_compilation_cache):
    # Two runs of the same job in the default layout (runs/<job>/<timestamp> under the
    # launcher's working directory) share runs/<job>/compilation-cache: the second run's
    # process 0 loads the step its first attempt needs. A --run-dir elsewhere keeps its own.
    job = os.path.join(REPO, "jobs", "linear.yaml")
    args = (job, "--set", "train.num_steps=10", "--set", "cluster.devices_per_process=1",
            "--set", "checkpoint.every_steps=0", "--set", "logging.tensorboard=false")
    seen = []
    for _ in range(2):
        result = launch(*args, cwd=str(tmp_path))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        (line,) = re.findall(CACHE_LINE, result.stdout, re.M)
        (summary,) = re.findall(SUMMARY_CACHE, result.stdout, re.M)
        seen.append((int(line[0]), int(line[1]), line[2], int(summary[0])))
    shared = str(tmp_path / "runs" / "linear" / "compilation-cache")
    (first_hits, first_misses, first_path, first_sum), (hits, _, path, total) = seen
    assert first_path == path == shared and first_hits == 0 and first_misses > 0 and first_sum == 0
    assert hits > 0 and total >= hits, seen
    assert os.listdir(shared)  # process 0 wrote its entries there, not in either run directory
    runs = sorted(d for d in os.listdir(tmp_path / "runs" / "linear") if d != "compilation-cache")
    assert len(runs) == 2 and not any(
        os.path.exists(tmp_path / "runs" / "linear" / d / "compilation-cache") for d in runs)
    # --run-dir outside runs/<job>/: its own cache, empty at first, though the job's is full
    own = tmp_path / "elsewhere"
    result = launch(*args, "--run-dir", str(own), cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    ((hits, misses, path),) = re.findall(CACHE_LINE, result.stdout, re.M)
    assert (hits, path) == ("0", str(own / "compilation-cache")) and int(misses) > 0
    ((summary_hits, _),) = re.findall(SUMMARY_CACHE, result.stdout, re.M)
    assert summary_hits == "0", result.stdout[-3000:]


def test_jax_compilation_cache_dir_in_the_workers_environment_names_the_cache(tmp_path, monkeypatch):
    # JAX's own variable for the cache directory, set where the workers run (here: the
    # launcher's environment, which local workers inherit), is the cache every run uses,
    # whatever its run directory; train.compilation_cache false still turns it off.
    team = tmp_path / "team-cache"
    monkeypatch.setattr(helpers, "SHARED_COMPILATION_CACHE", str(team))
    args = ("jobs/linear.yaml", "--set", "train.num_steps=10", "--set", "cluster.devices_per_process=1",
            "--set", "checkpoint.every_steps=0", "--set", "logging.tensorboard=false")
    seen = []
    for name in ("a", "b"):
        result = launch(*args, "--run-dir", str(tmp_path / name))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        ((hits, misses, path),) = re.findall(CACHE_LINE, result.stdout, re.M)
        seen.append((int(hits), int(misses), path))
        assert not (tmp_path / name / "compilation-cache").exists()
    assert [path for _, _, path in seen] == [str(team)] * 2 and os.listdir(team)
    assert seen[0][0] == 0 < seen[0][1] and seen[1][0] > 0, seen  # the second run loads the first's
    result = launch(*args, "--run-dir", str(tmp_path / "off"), "--set", "train.compilation_cache=false")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert re.search(r"^\[p0\] compilation cache: 0 hits, [1-9]\d* misses; .* \(off\)$", result.stdout, re.M), result.stdout


def test_resume_skips_a_truncated_checkpoint_and_continues(tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    first = launch("jobs/linear.yaml", *COMMON, "--set", "train.num_steps=20", "--run-dir", str(run_dir))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    state = run_dir / "checkpoints" / "step-0000020" / "state.npz"
    state.write_bytes(state.read_bytes()[:100])  # truncated after it was written
    resumed = launch("jobs/linear.yaml", *COMMON, "--resume", str(run_dir))
    out = resumed.stdout
    assert resumed.returncode == 0, out[-4000:] + resumed.stderr
    assert re.search(r"^\[p0\] warning: skipping checkpoint \S+/step-0000020: state\.npz is 100 bytes, "
                     r"the manifest says \d+ \(truncated\?\); trying the previous one$", out, re.M), out
    assert "[p0] resumed from the checkpoint of step 15 (attempt 1)" in out
    assert f"run directory {run_dir} (resuming; attempt 1)" in out
    assert_same_params(params(run_dir), uninterrupted)
    assert (run_dir / "logs" / "attempt-1" / "process-000.log").exists()
    assert "step 20/20" in (run_dir / "logs" / "process-000.log").read_text()  # attempt 0's log kept


def test_resume_with_every_checkpoint_corrupt_fails_and_touches_nothing(tmp_path):
    run_dir = tmp_path / "run"
    first = launch("jobs/linear.yaml", *COMMON, "--set", "train.num_steps=10",
                   "--set", "checkpoint.keep=2", "--run-dir", str(run_dir))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    ckpts = run_dir / "checkpoints"
    (ckpts / "step-0000010" / "state.npz").write_bytes(b"truncated")
    (ckpts / "step-0000005" / "manifest.json").write_text("{not json")
    before = {p: p.read_bytes() for p in ckpts.rglob("*") if p.is_file()}
    resumed = launch("jobs/linear.yaml", *COMMON, "--set", "train.num_steps=10", "--resume", str(run_dir))
    out = resumed.stdout
    assert resumed.returncode == 1, out[-3000:] + resumed.stderr
    # whichever process the launcher saw fail first, its last lines name the checkpoints
    summary = out[out.index("FAILED: process_id"):]
    assert f"every checkpoint in {ckpts} is corrupt" in summary, out[-3000:]
    assert "step-0000010: state.npz is 9 bytes" in out and "step-0000005: unreadable manifest" in out
    assert "step 1/10" not in out  # it did not start over
    assert {p: p.read_bytes() for p in ckpts.rglob("*") if p.is_file()} == before


def test_a_python_error_is_not_retried_and_says_so(tmp_path):
    run_dir = tmp_path / "run"
    # the default budgets: a program error is not retried, whatever the other classes allow
    result = launch("jobs/linear.yaml", *COMMON, *fault("raise", 7), "--run-dir", str(run_dir))
    out = result.stdout
    assert result.returncode == 1, out[-3000:]
    assert ("attempt 0 failed: process_id 1 on localhost exited with code 1: a Python error in the job "
            "[program error]; not retried: a restart repeats it (restarts.program_errors is 0)") \
        in out, out[-3000:]
    assert "RuntimeError: injected failure at step 7" in out
    assert "attempt 1" not in out and not (run_dir / "logs" / "attempt-1").exists()
    # the furthest step the ledger saw is the logs' (each worker's own failure line names its step)
    (attempt,) = checked_ledger(run_dir)["attempts"]
    logged = max(logged_steps(run_dir / "logs" / f"process-00{i}.log") for i in range(2))
    assert attempt["reached_step"] == logged >= 7 and attempt["buckets_s"]["teardown"] > 0


def attempt_pids(run_dir, attempt: int) -> list:
    ours = set(pids_with_env("PODLAUNCH_RUN_DIR", str(run_dir)))
    return sorted(ours & set(pids_with_env("PODLAUNCH_ATTEMPT", str(attempt))))


@pytest.mark.parametrize("kind", KINDS)
def test_a_sigstopped_worker_is_reported_killed_and_the_run_recovers(tmp_path, kind, request):
    run_dir = tmp_path / "run"
    if kind == "trainer":  # every step logged: the ledger's steps trained again are the logs'
        job = ("jobs/linear.yaml", *COMMON, *fault("sigstop", 12), "--set", "logging.log_every_steps=1")
    else:  # a program that reports: its heartbeats feed the watchdog as the trainer's do
        job = (program_job(tmp_path, "sigstop", target=1, at=12, steps=STEPS, num_processes=2),
               "--set", "restarts.backoff_s=0.2")
    with launched(*job, "--set", "restarts.max_restarts=1",
                  "--set", "watchdog.stall_timeout_s=3", "--run-dir", str(run_dir),
                  "--show", "all") as output:  # process 1's injection line as soon as it is printed
        output.wait_for("injecting sigstop", 120)
        injected_at = time.monotonic()
        output.wait_for("stalled: no step progress", 60)
        reported_at = time.monotonic()
        deadline = reported_at + 15
        while attempt_pids(run_dir, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not attempt_pids(run_dir, 0), output.text  # the stopped one too (SIGKILL)
        code, out = output.finish(120)
    assert code == 0, out[-4000:]
    # not before its stall_timeout_s (3 s from the last heartbeat before the stop, 0.5 s apart)
    assert reported_at - injected_at > 2.0, out
    # p0 waits in the collective for the stopped p1: both stop making progress within
    # milliseconds; the launcher names p1 because /proc says it is stopped.
    assert re.search(r"p1 stalled: no step progress for \d+\.\d s \(the process is stopped, e\.g\. by "
                     r"SIGSTOP\) \(stall_timeout_s 3\); last step seen of every process: "
                     r"p0 \d+ \([\d.]+ s ago\), p1 \d+ \([\d.]+ s ago\); killing every process",
                     out), out
    assert re.search(r"^p1 +localhost +failed \(first\) +stalled: no step progress", out, re.M), out
    assert "stalled (no step progress for " in out and "retried after 0.2 s" in out
    # the failed attempt's summary is said to be the attempt's, not the run's end
    said = out.index("attempt 0 is over, not the run: a restart follows; what attempt 0 reached:")
    assert said < out.index("FAILED: process_id 1 on localhost") < out.index("attempt 1"), out
    # the ledger of a stalled run: the stall's wait is failure detection and teardown
    ledger = checked_ledger(run_dir)
    stalled, again = ledger["attempts"]
    assert stalled["buckets_s"]["teardown"] > 2.0, stalled
    if kind == "trainer":
        assert "[p0] resumed from the checkpoint of step 10 (attempt 1)" in out
        assert_same_params(params(run_dir), request.getfixturevalue("uninterrupted"))
        logged = max(logged_steps(run_dir / "logs" / f"process-00{i}.log") for i in range(2))
        assert again["steps_again"] == logged - 10 > 0, (logged, again)
        assert again["buckets_s"]["retrained"] > 0
    else:  # the program is told the attempt and that it resumes
        assert "[p1] faulty_program: attempt 1, PODLAUNCH_RESUME=1" in out, out[-4000:]
        assert f"[p0] step {STEPS}/{STEPS} loss" in out
    assert not pids_with_env("PODLAUNCH_RUN_DIR", str(run_dir))


def test_an_exhausted_open_files_limit_is_a_cause_of_its_own_with_the_limit(tmp_path):
    # "Too many open files" was filed as a Python error in the job, with a retry hint
    result = launch("jobs/linear.yaml", *COMMON, *fault("emfile", 7), "--run-dir",
                    str(tmp_path / "run"))
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-4000:]
    assert re.search(r"attempt 0 failed: process_id 1 on localhost exited with code 1, a limit of "
                     r"its host ran out, which a restart finds run out again: too many open "
                     r"files: this process's limit is \d+ \(hard limit \d+\) \(ulimit -n\); "
                     r"raise it .*\[final\]; a restart would end the same way", out), out[-4000:]
    assert "a Python error in the job" not in out and "retried after" not in out


def test_a_launcher_short_of_open_files_keeps_its_readers_and_names_the_limit(tmp_path):
    # ulimit -n 20 (skypilot#3004): the readers died with tracebacks (the log opened outside
    # the try that keeps a reader alive), processes got no log, and the verdict invented a
    # 60 s join timeout; gloo then aborts a worker for the files it cannot open
    run_dir, limit = tmp_path / "run", 20
    command = f"ulimit -n {limit} && exec " + shlex.join(  # 2 x 2 devices: gloo needs more
        [*LAUNCH, "jobs/linear.yaml", "--set", "restarts.max_restarts=0", "--run-dir", str(run_dir)])
    done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env_for_tests(),
                          capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out[-4000:]
    assert done.returncode == 1, out[-4000:]
    assert f"too many open files (EMFILE; the launching shell's ulimit -n is {limit})" in out \
        or f"this process's limit is {limit} " in out, out[-4000:]
    assert "[final]; a restart would end the same way" in out, out[-4000:]
    assert all((run_dir / "logs" / f"process-00{i}.log").stat().st_size for i in range(2))
    assert "could not join the coordinator" not in out, out[-4000:]  # no invented join timeout
    assert not pids_with_env("PODLAUNCH_RUN_DIR", str(run_dir))


def test_a_frozen_process_is_named_the_cause_not_the_peer_the_coordinator_aborted(tmp_path):
    """jax-ml/jax#23599: a process frozen by SIGSTOP (a paused VM, a process stuck in the
    kernel) stops sending heartbeats; JAX's coordination service aborts its peer after the
    heartbeat timeout, and that peer ends first. The summary named the peer ("killed by SIGABRT
    ... a crash"); the frozen one is the cause, as /proc says."""
    run_dir = tmp_path / "run"
    with launched("jobs/linear.yaml", *COMMON, *fault("sigstop", 12), "--set",
                  "restarts.max_restarts=0", "--set", "watchdog.stall_timeout_s=null",
                  "--set", "watchdog.first_step_timeout_s=null",
                  "--set", "distributed.heartbeat_timeout_s=3", "--run-dir", str(run_dir),
                  "--show", "all") as output:
        output.wait_for("injecting sigstop", 120)
        code, out = output.finish(120)
    assert code == 1, out[-4000:]
    assert re.search(r"^podlaunch: p1 stalled: stopped \(SIGSTOP, a paused VM or a debugger\) while "
                     r"its peers waited for it: JAX's coordination service ended p0 when p1's "
                     r"heartbeats ceased; .*; p0 ended \(.*\) because of it; killing every "
                     r"process", out, re.M), out[-4000:]
    assert re.search(r"^p1 +localhost +failed \(first\) +stalled: stopped", out, re.M), out[-4000:]
    assert not pids_with_env("PODLAUNCH_RUN_DIR", str(run_dir))


@pytest.mark.parametrize("mode, failure_class, budget", [("sigkill", "infrastructure", "infrastructure"),
                                                         ("sigterm", "preemption", "preemptions")])
def test_a_signal_death_is_retried_by_default_under_its_own_budget_until_it_is_spent(
        tmp_path, mode, failure_class, budget):
    """A fault on every attempt (faulty_task:make): SIGKILL is an infrastructure fault,
    SIGTERM (exit 143) a preemption; each retried with no restarts.max_restarts, the first
    at once and the second after backoff_s, until its class's budget of 2 is spent."""
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", *COMMON, "--set", "task.name=faulty_task:make",
                    "--set", "task.args.crash_at_step=3", "--set", "task.args.crash_process_id=1",
                    "--set", f"task.args.mode={mode}", "--set", f"restarts.{budget}=2",
                    # a SIGTERM that stops at once (no agreed checkpoint): every attempt again
                    "--set", "checkpoint.notice_grace_s=0", "--run-dir", str(run_dir))
    out = result.stdout
    assert result.returncode == 1, out[-4000:] + result.stderr
    failed = re.findall(r"^podlaunch: attempt (\d) .*failed: process_id 1 on localhost (.*) \[(.*)\]; "
                        r"(.*)$", out, re.M)
    assert [(n, c) for n, _, c, _ in failed] == [("0", failure_class), ("1", failure_class),
                                                ("2", failure_class)], out[-4000:]
    assert failed[0][3] == (f"restarting from the latest checkpoint in 0 s ({failure_class} restart "
                            "1 of 2)")  # at once: the first of its class
    assert failed[1][3] == (f"restarting from the latest checkpoint in 0.2 s ({failure_class} "
                            "restart 2 of 2)")  # the class repeats: backoff_s
    assert failed[2][3] == f"not retrying: restarts.{budget} is 2 and 2 used"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["failures"] == {failure_class: 3} and record["last_failure"]["attempt"] == 2
    assert record["last_failure"]["class"] == failure_class and record["attempts"] == 3


def test_a_notice_to_one_worker_stops_every_process_after_one_saved_step(tmp_path, uninterrupted):
    """Issue 27: process 1 gets SIGTERM (a preemption's notice) after step 17 of 40
    (checkpoints every 5): every process stops after one agreed step, process 0 saves it,
    the restart resumes from it at once: no step trained twice, the uninterrupted params."""
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", *COMMON, *fault("sigterm", 17), "--run-dir", str(run_dir))
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr
    step = assert_one_agreed_stop(run_dir, 2, 17)
    assert re.search(rf"attempt 0 failed: process_id \d on localhost exited with code 143 \(SIGTERM as "
                     rf"a shell reports it\), after a notice from process 1: every process stops after "
                     rf"step {step}.* \[preemption\]; restarting from the latest checkpoint in 0 s", out), out
    assert_same_params(params(run_dir), uninterrupted)
    assert not pids_with_env("PODLAUNCH_RUN_DIR", str(run_dir))


def test_a_notice_to_the_launcher_saves_one_step_that_resume_continues(tmp_path, uninterrupted):
    """SIGTERM to the launcher (its VM's notice; Ctrl-C the same): it tells every worker,
    they stop after one agreed step and process 0 saves it; ``launch --resume`` continues
    from exactly that step to the uninterrupted params. Process 1's steps take 1 s (a big
    model's) and cluster.grace_s is 0.5 s: the teardown waits for the agreed save
    (checkpoint.notice_grace_s), where grace_s alone SIGKILLed it before the save."""
    run_dir = tmp_path / "run"
    slow = ("--set", "task.name=faulty_task:make", "--set", "task.args.slow_process_id=1",
            "--set", "task.args.sleep_s=1.0", "--set", "task.args.slow_attempt=0")
    with launched("jobs/linear.yaml", *COMMON, *slow, "--set", "cluster.grace_s=0.5",
                  "--run-dir", str(run_dir)) as out:
        out.wait_for(r"^\[p0\] checkpoint of step 5 saved", 120)
        out.proc.send_signal(signal.SIGTERM)
        code, text = out.finish(60)
    assert code == 130, text
    assert "saving the step every process agreed on (checkpoint.notice_grace_s)" in text, text
    assert "SIGKILL" not in text, text
    step = agreed_step(run_dir, 2)
    assert step >= 5 and (run_dir / "checkpoints" / f"step-{step:07d}").is_dir()
    result = launch("jobs/linear.yaml", *COMMON, *slow, "--resume", str(run_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert re.search(rf"^\[p0\] resumed from the checkpoint of step {step} ", result.stdout, re.M)
    assert_same_params(params(run_dir), uninterrupted)


def test_a_crash_resumes_from_the_local_tier_not_the_last_persistent_checkpoint(tmp_path,
                                                                                uninterrupted):
    """Issue 27: process 0's checkpoints every 40 steps, every process's local copy every 5;
    process 0 SIGKILLed after step 17: the restart resumes from a local copy of step 15,
    not from step 0, and ends at the uninterrupted params; the local copies are gone after."""
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", *COMMON, *fault("sigkill", 17, process_id=0),
                    *WRITER_TIME, "--set", "checkpoint.every_steps=40",
                    "--set", "checkpoint.local_every_steps=5", "--run-dir", str(run_dir))
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr
    # step 15's copy, or an earlier one when the copies after it were still being written
    # (the survivor is ended by JAX's coordination agent once process 0, which runs the
    # service, is gone; on a loaded machine the writer thread lags a copy or two): never
    # step 0, never a persistent checkpoint
    found = re.search(r"^\[p0\] resumed from the checkpoint of step (1[05]|5) \(attempt 1\) in [0-9.]+ "
                      r"s: process [01]'s local copy$", out, re.M)
    assert found, out[-4000:]
    assert not (run_dir / "checkpoints" / "step-0000015").exists()  # not process 0's persistent one
    assert checked_ledger(run_dir)["attempts"][1]["resumed_step"] == int(found[1])
    assert_same_params(params(run_dir), uninterrupted)
    assert not list((run_dir / "local-checkpoints").glob("process-*"))
    # one writer of the host's copies per attempt: the two processes share this machine
    for logs in (run_dir / "logs", run_dir / "logs" / "attempt-1"):
        writers = [p.name for p in sorted(logs.glob("process-*.log"))
                   if "local tier: this process writes its host's copies" in p.read_text()]
        assert writers == ["process-000.log"], writers


# ---- over the real sshd hosts ----------------------------------------------------
def test_restart_over_ssh_broadcasts_process_0s_checkpoint(tmp_path, two_ssh_hosts, uninterrupted):
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--cluster", ssh_cluster(tmp_path, two_ssh_hosts), *COMMON,
                    *fault("sigkill", 17), "--set", "restarts.max_restarts=1", "--run-dir", str(run_dir))
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr
    # process 0 may report its peer's reset first (a cascade); the SIGKILL is the cause either way
    assert re.search(r"attempt 0 failed: process_id 1 on 127\.0\.0\.3 was killed by SIGKILL \(no notice: "
                     r"the OOM killer, a preemption without one, or a crash\)(; process_id 0 \(exit code "
                     r"1\) was reported first, but its last lines say it stopped because another process "
                     r"did)? \[infrastructure\]; restarting", out), out[-4000:]
    assert out.count("preflight ok on 2 hosts") == 2  # the restart preflights again
    ports = re.findall(r"coordinator 127\.0\.0\.2:(\d+)", out)
    # each attempt gets a fresh coordinator port: the old one may still be held by a dying
    # coordinator or in TIME_WAIT
    assert len(ports) == 2 and ports[0] != ports[1], ports
    assert re.search(r"^resumed from the checkpoint of step 15 \(attempt 1\) in [0-9.]+ s$",
                     logtimes.read_text(run_dir / "logs" / "attempt-1" / "process-001.log"), re.M)
    assert_same_params(params(run_dir), uninterrupted)
    # the ledger over ssh: from the lines the launcher read off each host's channel
    first, again = checked_ledger(run_dir)["attempts"]
    assert first["buckets_s"]["launch"] > 0 and again["buckets_s"]["launch"] > 0  # preflight, twice
    assert first["buckets_s"]["teardown"] > 0 and again["buckets_s"]["restore"] > 0
    # only process 0's host has checkpoints: process 1 got the state by broadcast
    remote = [remote_run_dir(tmp_path / f"host{i}", run_dir) for i in range(2)]
    assert sorted(os.listdir(remote[0] / "checkpoints"))[-1] == "step-0000040"
    assert not (remote[1] / "checkpoints").exists()
    # and a copy of host 0's newest checkpoints (keep: 3) in the local run directory, byte for byte
    local = sorted(os.listdir(run_dir / "checkpoints"))
    assert local == sorted(os.listdir(remote[0] / "checkpoints"))[-3:] == \
        ["step-0000030", "step-0000035", "step-0000040"], local
    for name in local:
        for entry in ("manifest.json", "state.npz"):
            assert (run_dir / "checkpoints" / name / entry).read_bytes() == \
                (remote[0] / "checkpoints" / name / entry).read_bytes()
    assert (run_dir / "logs" / "attempt-1" / "process-001.log").exists()
    for d in remote:
        assert not pids_with_env("PODLAUNCH_RUN_DIR", str(d))


def test_a_sigterm_on_every_attempt_spends_the_preemption_budget_over_ssh(tmp_path, two_ssh_hosts):
    """Over two real sshd hosts (issue 26): process 1 SIGTERMs itself at step 3 of every
    attempt (exit 143, a preemption's notice): retried at once under restarts.preemptions,
    and the message names that budget once it is spent; the ledger of both attempts adds up."""
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--cluster", ssh_cluster(tmp_path, two_ssh_hosts), *COMMON,
                    "--set", "task.name=faulty_task:make", "--set", "task.args.crash_at_step=3",
                    "--set", "task.args.crash_process_id=1", "--set", "task.args.mode=sigterm",
                    "--set", "checkpoint.notice_grace_s=0",  # at once: no step saved, so again
                    "--set", "restarts.preemptions=1", "--run-dir", str(run_dir))
    out = result.stdout
    assert result.returncode == 1, out[-4000:] + result.stderr
    failed = re.findall(r"^podlaunch: attempt (\d) .*failed: process_id 1 on 127\.0\.0\.3 (.*) \[(.*)\]; "
                        r"(.*)$", out, re.M)
    assert [(n, c) for n, _, c, _ in failed] == [("0", "preemption"), ("1", "preemption")], out[-4000:]
    assert failed[0][3] == "restarting from the latest checkpoint in 0 s (preemption restart 1 of 1)"
    assert failed[1][3] == "not retrying: restarts.preemptions is 1 and 1 used"
    ledger = checked_ledger(run_dir)
    assert [a["attempt"] for a in ledger["attempts"]] == [0, 1]
    assert all(a["buckets_s"]["teardown"] > 0 for a in ledger["attempts"])


def test_a_notice_over_ssh_stops_every_host_after_one_saved_step(tmp_path, two_ssh_hosts,
                                                                  uninterrupted):
    """Issue 27 over two real sshd hosts: process 1's SIGTERM after step 17 becomes one step
    every process stops after, saved by process 0 on its host; the restart resumes from it."""
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--cluster", ssh_cluster(tmp_path, two_ssh_hosts), *COMMON,
                    *fault("sigterm", 17), "--run-dir", str(run_dir))
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr
    step = assert_one_agreed_stop(run_dir, 2, 17)
    assert re.search(rf"attempt 0 failed: process_id \d on 127\.0\.0\.\d exited with code 143 .*after "
                     rf"a notice from process 1: every process stops after step {step}", out), out
    assert_same_params(params(run_dir), uninterrupted)
    for i in range(2):
        assert not pids_with_env("PODLAUNCH_RUN_DIR", str(remote_run_dir(tmp_path / f"host{i}", run_dir)))


def test_host_0_back_empty_resumes_from_another_hosts_local_copy(tmp_path, two_ssh_hosts,
                                                                 uninterrupted):
    """Issue 27 over two real sshd hosts: process 0 removes its whole run directory on host 0
    (checkpoints and local copies) and is SIGKILLed after step 17; with no persistent
    checkpoint before step 40, the restart restores every process from process 1's local
    copy on host 1 (step 15, an earlier one when 15's was unfinished, a later one up to 17 when
    15's was put off by the tier's minimum interval), checked by its sha256, and ends
    at the uninterrupted params."""
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--cluster", ssh_cluster(tmp_path, two_ssh_hosts), *COMMON,
                    *fault("wipe_sigkill", 17, process_id=0), *WRITER_TIME,
                    "--set", "checkpoint.every_steps=40",
                    "--set", "checkpoint.local_every_steps=5", "--run-dir", str(run_dir))
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr
    # 15; 10 or 5 where the copies after it were unfinished (a loaded machine's writer thread
    # lags); 16 or 17 where a copy came within MIN_INTERVAL_S of the one before and waited for
    # a later call boundary (worker.recovery.localtier: seen once in CI, step 16)
    assert re.search(r"^\[p0 127\.0\.0\.2\] resumed from the checkpoint of step (?:1[05-7]|5) \(attempt 1\) "
                     r"in [0-9.]+ s: process 1's local copy$", out, re.M), out[-4000:]
    # one writer per host: each host's process writes its own host's copies
    assert len(re.findall(r"local tier: this process writes its host's copies", "".join(
        p.read_text() for p in (run_dir / "logs").glob("process-*.log")))) == 2
    assert_same_params(params(run_dir), uninterrupted)
    for i in range(2):
        remote = remote_run_dir(tmp_path / f"host{i}", run_dir)
        assert not (remote / "local-checkpoints").exists()
        assert not pids_with_env("PODLAUNCH_RUN_DIR", str(remote))


def test_resume_over_ssh_puts_back_the_checkpoints_a_new_host_0_lacks(tmp_path, two_ssh_hosts, uninterrupted):
    cluster = {
        "backend": "ssh", "ssh_config_file": two_ssh_hosts.ssh_config, "python": sys.executable,
        "hosts": [{"host": h, "workdir": str(tmp_path / f"host{i}")} for i, h in enumerate(two_ssh_hosts.hosts)],
        "env": {"PYTHONPATH": os.pathsep.join([PROGRAMS, REPO])},
    }
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    run_dir = tmp_path / "run"
    first = launch("jobs/linear.yaml", "--cluster", str(tmp_path / "cluster.yaml"), *COMMON,
                   "--set", "train.num_steps=20", "--run-dir", str(run_dir))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["step-0000010", "step-0000015", "step-0000020"]
    # host 0 is replaced by a machine that has none of the run's files
    shutil.rmtree(tmp_path / "host0" / "runs")
    again = launch("jobs/linear.yaml", "--cluster", str(tmp_path / "cluster.yaml"), *COMMON,
                   "--resume", str(run_dir))
    out = again.stdout
    assert again.returncode == 0, out[-3000:] + again.stderr
    assert "127.0.0.2: put back 3 checkpoints it lacked (newest step-0000020)" in out, out[-3000:]
    assert "[p0 127.0.0.2] resumed from the checkpoint of step 20 (attempt 1)" in out, out[-3000:]
    assert_same_params(params(run_dir), uninterrupted)  # 20 + 20 steps == 40 uninterrupted


@pytest.mark.slow
def test_a_resume_with_a_changed_spec_says_what_changed_and_keeps_the_earlier_spec(tmp_path):
    # issue 25, item 10: the record of what the first attempt ran is not overwritten
    run_dir = tmp_path / "run"
    args = ("jobs/linear.yaml", "--set", "cluster.devices_per_process=1",
            "--set", "checkpoint.every_steps=10")
    first = launch(*args, "--set", "train.num_steps=20", "--run-dir", str(run_dir))
    assert first.returncode == 0, first.stdout + first.stderr
    again = launch(*args, "--set", "train.num_steps=30", "--set", "optimizer.learning_rate=0.5",
                   "--resume", str(run_dir))
    out = again.stdout + again.stderr
    assert again.returncode == 0, out
    assert re.search(r"resuming with 2 changed settings \(the earlier attempts' spec is kept as "
                     r"spec\.before-attempt-1\.yaml\): optimizer\.learning_rate: 0\.1 -> 0\.5; "
                     r"train\.num_steps: 20 -> 30", out), out
    kept = yaml.safe_load(open(run_dir / "spec.before-attempt-1.yaml"))
    now = yaml.safe_load(open(run_dir / "spec.yaml"))
    assert (kept["optimizer"]["learning_rate"], now["optimizer"]["learning_rate"]) == (0.1, 0.5)
    # the same spec again: nothing said, nothing kept
    same = launch(*args, "--set", "train.num_steps=30", "--set", "optimizer.learning_rate=0.5",
                  "--resume", str(run_dir))
    assert same.returncode == 0 and "changed setting" not in same.stdout, same.stdout
    assert sorted(p.name for p in run_dir.glob("spec*.yaml")) == ["spec.before-attempt-1.yaml",
                                                                   "spec.yaml"]
    # a checkpoint of a manifest format this version does not know is refused, naming its writer
    newest = sorted((run_dir / "checkpoints").iterdir())[-1] / "manifest.json"
    manifest = json.loads(newest.read_text())
    assert manifest["format"] == 1 and manifest["written_by"].startswith("podlaunch ")
    newest.write_text(json.dumps({**manifest, "format": 2, "written_by": "podlaunch 9.0.0"}))
    refused = launch(*args, "--set", "train.num_steps=30", "--set", "optimizer.learning_rate=0.5",
                     "--resume", str(run_dir))
    assert refused.returncode == 1, refused.stdout[-3000:] + refused.stderr
    assert re.search(r"its manifest is format 2, written by podlaunch 9\.0\.0; this podlaunch "
                     r"\(\S+\) reads format 1 only", refused.stdout), refused.stdout[-3000:]
