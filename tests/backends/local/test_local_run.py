"""Single-host debug mode end to end: real JAX processes, real event files, the process table.

These tests start several JAX processes each, so they are marked slow; CI runs them.
"""

import json
import os
import re
import signal
import time

import numpy as np
import pytest

from harness.helpers import (KINDS, NO_RESTARTS, REPO, PROGRAMS, checked_ledger, event_files, launch, launched, long_job, read_scalars, run_pids,
                     read_own_step_times, wait_gone)

pytestmark = pytest.mark.slow


def read_params(run_dir) -> list[np.ndarray]:
    with np.load(os.path.join(run_dir, "params.npz")) as f:
        return [f[k] for k in sorted(f.files)]


def test_main_job_trains_and_logs_to_tensorboard(tmp_path):
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    # the default view: process 0's progress, each step once; p1's lines in its log only
    assert re.search(r"^\[p0\] step 100/100 loss", out, re.M)
    assert not re.search(r"^\[p1\]", out, re.M) and "Gloo" not in out
    assert len(re.findall(r"step 100/100 loss", out)) == 1
    assert f"podlaunch: view: launch tensorboard {run_dir}" in out  # what the README installed
    assert "tensorboard --logdir" not in out
    assert "OK: 2 processes succeeded" in out
    # one event file of the job, process 0's, with the loss at every logged step, and the
    # launcher's of the goodput ledger beside it: one TensorBoard run, not two (issue 50);
    # and each process's own step times in a run of its own (a colour each on one chart),
    # written by process 0 too
    files = sorted(event_files(str(run_dir)))
    logdir = run_dir / "tensorboard"
    assert sorted((os.path.dirname(f), f.rsplit(".", 1)[1]) for f in files) == [
        (str(logdir), "goodput"), (str(logdir), "process-000"),
        (str(logdir / "process_000"), "process-000"), (str(logdir / "process_001"), "process-000")]
    own = read_own_step_times(str(logdir))
    assert [[s for s, _ in own[i]] for i in (0, 1)] == [list(range(10, 101, 10))] * 2
    scalars = read_scalars(str(run_dir / "tensorboard"))
    steps = [step for step, _ in scalars["loss"]]
    assert steps == list(range(10, 101, 10))
    losses = [value for _, value in scalars["loss"]]
    assert losses[-1] < losses[0] / 5, losses
    assert losses[-1] < 0.011  # near the noise floor: noise_std**2 = 0.01
    for tag in ("learning_rate", "step_time_s", "examples_per_s"):
        assert [s for s, _ in scalars[tag]] == steps
    assert sorted(os.listdir(run_dir / "logs")) == ["process-000.log", "process-001.log"]
    log1 = (run_dir / "logs" / "process-001.log").read_text()
    assert "step 100/100" in log1 and "[p1]" not in log1
    # library noise: in the log, never on the console (gloo's two threads may interleave its words)
    assert "[Gloo]" in log1
    record = json.loads((run_dir / "run.json").read_text())
    assert (record["state"], record["attempts"], record["step"]) == ("succeeded", 1, 100)
    assert record["final_loss"] == pytest.approx(losses[-1], rel=1e-5)
    assert (run_dir / "spec.yaml").exists()
    assert not run_pids(str(run_dir))
    # the goodput ledger: a clean run's time adds up, and shows as scalars and in the summary
    ledger = checked_ledger(run_dir)
    (attempt,) = ledger["attempts"]
    buckets = attempt["buckets_s"]
    assert buckets["productive"] > 0 and buckets["checkpoint"] > 0 and buckets["start_and_join"] > 0
    assert buckets["teardown"] == buckets["retrained"] == buckets["restart_wait"] == 0
    assert (attempt["resumed_step"], attempt["reached_step"], attempt["steps_again"]) == (0, 100, 0)
    assert re.search(rf"^podlaunch: goodput {ledger['run']['goodput']:.2f}: [\d.]+ s of the run's "
                     r"[\d.]+ s went into training steps that count; largest loss of time "
                     r"\(badput\): ", out, re.M), out
    goodput = read_scalars(str(run_dir / "tensorboard"))
    assert goodput["goodput/goodput"] == [(100, pytest.approx(ledger["run"]["goodput"], abs=1e-4))]
    assert goodput["goodput/productive_s"][0][1] == pytest.approx(buckets["productive"], abs=1e-3)


def numpy_gradient_descent(steps: int, lr: float, num_examples=256, in_features=4, noise_std=0.1,
                           data_seed=1, init_seed=0):
    """Plain full-batch gradient descent on the same data and init, in float64."""
    import jax

    from worker.data.sources import synthetic_rows
    from worker.tasks import init_linear

    x, y = synthetic_rows(data_seed, in_features, 1, noise_std, 0, num_examples)
    x, y = x.astype(np.float64), y.astype(np.float64)
    w, b = (np.asarray(a, np.float64) for a in init_linear(jax.random.PRNGKey(init_seed), in_features, 1))
    for _ in range(steps):
        residual = x @ w + b - y
        w = w - lr * (2.0 / num_examples) * (x.T @ residual)
        b = b - lr * (2.0 / num_examples) * residual.sum(axis=0)
    return [w, b]


def test_params_do_not_depend_on_the_topology_or_the_parallelism_and_equal_numpy_gd(tmp_path):
    # pmap on every topology; train.parallelism jit (jax.jit over a global mesh of every
    # process's devices) on the multi-device ones, against pmap's params on the same one
    finals = {}
    for processes, devices, parallelism in [(1, 1, "pmap"), (1, 4, "pmap"), (2, 2, "pmap"),
                                            (4, 1, "pmap"), (1, 4, "jit"), (2, 2, "jit"),
                                            (4, 1, "jit")]:
        run_dir = tmp_path / f"{processes}x{devices}-{parallelism}"
        result = launch("jobs/linear.yaml", "--run-dir", str(run_dir),
                        "--set", "train.num_steps=30", "--set", "logging.tensorboard=false",
                        "--set", f"cluster.num_processes={processes}",
                        "--set", f"cluster.devices_per_process={devices}",
                        "--set", f"train.parallelism={parallelism}")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        assert ("jax.jit over a global mesh" in result.stdout) == (parallelism == "jit")
        finals[(processes, devices, parallelism)] = read_params(run_dir)
    reference = numpy_gradient_descent(steps=30, lr=0.1)
    for (processes, devices, parallelism), params in finals.items():
        topology = (processes, devices, parallelism)
        for got, want, base, pmap in zip(params, reference, finals[(1, 1, "pmap")],
                                         finals[(processes, devices, "pmap")]):
            np.testing.assert_allclose(got, base, rtol=1e-5, atol=1e-7, err_msg=str(topology))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(topology))
            np.testing.assert_allclose(got, pmap, rtol=1e-6, atol=0, err_msg=str(topology))


def run_until_it_fails(*args, timeout_s=120):
    """Start a launch, note when the injected fault fires, and read to the launcher's exit.

    Each wait fails at its own deadline (a silent hang included), not at pytest's timeout.
    """
    with launched(*args) as out:
        out.wait_for("faulty_task: injecting", timeout_s)
        injected_at = time.monotonic()
        code, text = out.finish(timeout_s)
        return code, text, injected_at, time.monotonic()


@pytest.mark.parametrize("mode,what", [("raise", "exit code 1"), ("sigkill", "killed by SIGKILL")])
def test_a_crash_stops_every_process(tmp_path, mode, what):
    run_dir = tmp_path / "run"
    code, out, injected_at, ended_at = run_until_it_fails(
        "jobs/linear.yaml", "--run-dir", str(run_dir),
        "--set", "cluster.num_processes=4", "--set", "cluster.devices_per_process=1",
        "--set", "train.num_steps=100000", "--set", "logging.log_every_steps=1",
        "--set", "task.name=faulty_task:make", "--set", "task.args.crash_at_step=7",
        "--set", "task.args.crash_process_id=2", "--set", f"task.args.mode={mode}", *NO_RESTARTS,
        "--show", "all")  # the injection line of process 2 as soon as it is printed
    assert code == 1, out
    # the order of events: the fault, the launcher noticing it and stopping the others, the summary;
    # how fast is for bench/ (a loaded 2-core machine must not fail this), the bound only catches
    # a launcher that waits for the job to end by itself (it has 100000 steps to go)
    # (the first failure noticed may be a peer's reaction; the summary names the root cause)
    stopping = re.search(r"^podlaunch: p\d failed \([^)]*\)(; stopping the other [1-3] process(es)?)?$", out, re.M)
    assert stopping, out
    assert out.index("faulty_task: injecting") < stopping.start() < out.index("FAILED:"), out
    assert ended_at - injected_at < 60, out
    assert not run_pids(str(run_dir))
    summary = out[out.index("FAILED:"):]
    # a raise is reported by the worker at its step; a SIGKILL only shows the last logged step
    where = "at step 7" if mode == "raise" else "after step 7, its last logged step"
    assert summary.startswith(f"FAILED: process_id 2 on localhost ({what}) {where}; it failed first."), summary
    assert "faulty_task: injecting" in summary  # the tail of the failed process's log
    if mode == "raise":
        assert "RuntimeError: injected failure at step 7" in summary
    assert re.search(r"^p2 +localhost +failed \(first\)", summary, re.M)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_everything_and_exits_130(tmp_path, sig, kind):
    run_dir = tmp_path / "run"
    with launched(*long_job(kind, tmp_path, log_every=50), "--run-dir", str(run_dir)) as out:
        out.wait_for(r"^\[p0\] step \d+/", 120)  # p0 logged a step: p1 took part in it
        assert len(run_pids(str(run_dir))) == 2, out.text
        out.proc.send_signal(sig)
        code, text = out.finish(60)
    assert code == 130, text
    assert "INTERRUPTED: every process was stopped." in text
    assert not wait_gone(str(run_dir), 5.0)


def test_a_user_task_plugs_in(tmp_path):
    # faulty_task with no fault is a user task from tests/ (on PYTHONPATH): same params as built-in
    runs = {}
    for name in ("linear_regression", "faulty_task:make"):
        run_dir = tmp_path / name.replace(":", "_")
        result = launch("jobs/linear.yaml", "--run-dir", str(run_dir), "--set", f"task.name={name}",
                        "--set", "train.num_steps=10", "--set", "cluster.num_processes=1")
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr
        runs[name] = read_params(run_dir)
    for a, b in zip(*runs.values()):
        np.testing.assert_array_equal(a, b)


def test_a_mismatched_plan_is_reported_before_the_first_step(tmp_path):
    # The worker checks what JAX reports against the plan: here something on the hosts
    # (a sitecustomize, as site setups do) makes JAX see 3 devices where the plan says 2,
    # so every process fails with a clear message. (cluster.env may not set JAX's device
    # variables: the spec refuses that before launch.)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['JAX_NUM_CPU_DEVICES'] = '3'\n")
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--run-dir", str(run_dir), "--set",
                    f"cluster.env.PYTHONPATH={site}{os.pathsep}{PROGRAMS}{os.pathsep}{REPO}")
    assert result.returncode == 1
    assert "JAX disagrees with the launcher's plan: local_device_count is 3, the plan says 2" in result.stdout
    assert "exit code 3" in result.stdout


def test_diabetes_job_reaches_the_least_squares_optimum(tmp_path):

    run_dir = tmp_path / "run"
    result = launch("jobs/diabetes.yaml", "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    table = np.loadtxt(os.path.join(REPO, "jobs", "data", "diabetes.csv"), delimiter=",", skiprows=1)
    x, y = table[:, :-1], table[:, -1:]
    design = np.hstack([x, np.ones((len(x), 1))])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    optimum = float(np.mean((design @ coef - y) ** 2))
    w, b = read_params(run_dir)  # keys "[0]" (w) and "[1]" (b)
    final = float(np.mean((x @ w + b - y) ** 2))
    assert optimum <= final <= optimum * 1.01, (final, optimum)
    logged = read_scalars(str(run_dir / "tensorboard"))["loss"]
    assert logged[-1][0] == 500 and logged[-1][1] <= optimum * 1.01


# ---- promises a real run keeps (issue 18, item 5) ------------------------------------------
QUIET_LONG = ("--set", "train.num_steps=1000000", "--set", "logging.log_every_steps=20",
              "--set", "logging.tensorboard=false", "--set", "checkpoint.every_steps=0")


def test_a_sigkilled_launcher_takes_its_local_workers_with_it(tmp_path):
    # SIGKILL cannot be caught: only PR_SET_PDEATHSIG (set on each worker) ends them. The run is
    # silent after joining (no progress lines, heartbeats or checkpoints), so no worker dies of a
    # broken pipe instead: survivors would train on unseen.
    run_dir = tmp_path / "run"
    with launched("jobs/linear.yaml", "--run-dir", str(run_dir), *QUIET_LONG, "--show", "all",
                  "--set", "logging.log_every_steps=1000000", "--set", "watchdog.stall_timeout_s=null") as out:
        # both processes past their first step (gloo's "connected" lines reach the logs only)
        out.wait_for(r"^\[p\d\] compilation cache: ", 120, count=2)
        assert len(run_pids(str(run_dir))) == 2, out.text
        out.proc.kill()
        out.proc.wait(10)
    assert not wait_gone(str(run_dir), 15.0)


def test_the_stall_watchdog_ends_a_live_hang(tmp_path):
    # process 1 is alive and sleeping (no SIGSTOP): only the missing progress shows it
    run_dir = tmp_path / "run"
    with launched("jobs/linear.yaml", "--run-dir", str(run_dir), *QUIET_LONG,
                  "--set", "logging.log_every_steps=1", "--set", "watchdog.stall_timeout_s=4",
                  "--show", "all",  # process 1's injection line
                  "--set", "task.name=faulty_task:make", "--set", "task.args.crash_at_step=5",
                  "--set", "task.args.crash_process_id=1", "--set", "task.args.mode=stall",
                  *NO_RESTARTS) as out:
        out.wait_for("faulty_task: injecting stall at step 5", 120)
        injected_at = time.monotonic()
        out.wait_for("killing every process", 60)
        while run_pids(str(run_dir)) and time.monotonic() < injected_at + 30:
            time.sleep(0.05)
        gone_at = time.monotonic()
        code, text = out.finish(90)
    assert code == 1, text
    # the stacks were read before the kill, and the teardown still ended within
    # stall_timeout_s + 5 s of the hang
    assert gone_at - injected_at <= 4 + 5, (gone_at - injected_at, text[-3000:])
    assert re.search(r"^podlaunch: stacks \(stalled\): read 2 of 2 processes in \d\.\d s$", text, re.M), text
    # the summary names the function process 1 hangs in, and where process 0 waits for it
    assert re.search(r"^stacks: p1( \(stalled\))? stands in on_step_end \(faulty_task\.py:\d+\)$",
                     text, re.M), text[-3000:]
    # (podlaunch's worker waiting on the device: worker/telemetry/steptimer.py's wait, in JAX's own)
    assert re.search(r"^stacks: p0( \(stalled\))? stands in \w+ \(\w+\.py:\d+\), in \w+ \(", text,
                     re.M), text[-3000:]
    for process_id in (0, 1):  # every thread of each process, beside its log
        dump = (run_dir / "logs" / f"process-00{process_id}.stacks.txt").read_text()
        threads = dump.count("(most recent call first):")  # every Python thread (JAX's are native)
        assert threads >= 1 and dump.startswith(f"# p{process_id}: {threads} thread"), dump
    # p0 blocks in the next step's collective behind the hung p1, so both stop at step 5 and the
    # launcher cannot tell them apart (no /proc state differs, as SIGSTOP's does): it may name either
    assert re.search(r"p[01] stalled: no step progress for \d+\.\d s \(stall_timeout_s 4\); ", text), text
    assert "stopped, e.g. by SIGSTOP" not in text
    assert re.search(r"^FAILED: process_id [01] on localhost \(stalled: no step progress", text, re.M), text[-3000:]
    assert not wait_gone(str(run_dir), 5.0)


def test_the_first_step_timeout_ends_a_run_that_never_steps(tmp_path):
    # the task hangs while it is being made, before any step: only first_step_timeout_s applies
    (tmp_path / "hang_task.py").write_text("import time\n\ndef make():\n    time.sleep(3600)\n")
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--run-dir", str(run_dir), *QUIET_LONG,
                    "--set", f"cluster.env.PYTHONPATH={tmp_path}{os.pathsep}{REPO}",
                    "--set", "task.name=hang_task:make", "--set", "watchdog.stall_timeout_s=null",
                    "--set", "watchdog.first_step_timeout_s=6", *NO_RESTARTS, timeout_s=90)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    assert re.search(r"stalled: no first step after \d+\.\d s \(first_step_timeout_s 6\); last step seen "
                     r"of every process: p0 none, p1 none", result.stdout), result.stdout[-3000:]
    assert not wait_gone(str(run_dir), 5.0)


def test_initialization_timeout_ends_a_run_whose_peer_never_joins(tmp_path):
    # process 1 hangs before it joins (a sitecustomize, as a site setup would); process 0 waits in
    # jax.distributed.initialize for initialization_timeout_s, then fails; no watchdog is on
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get('PODLAUNCH_PROCESS_ID') == '1':\n    time.sleep(3600)\n")
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = launch("jobs/linear.yaml", "--run-dir", str(run_dir), *QUIET_LONG,
                    "--set", f"cluster.env.PYTHONPATH={site}{os.pathsep}{PROGRAMS}{os.pathsep}{REPO}",
                    "--set", "watchdog.stall_timeout_s=null", "--set", "watchdog.first_step_timeout_s=null",
                    "--set", "distributed.initialization_timeout_s=5", timeout_s=120)
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    assert re.search(r"^FAILED: process_id 0 on localhost", result.stdout, re.M), result.stdout[-3000:]
    # the default (60 s) would end it much later; 5 s plus start-up on a loaded machine ends well before
    assert elapsed < 55, (elapsed, result.stdout[-3000:])
    assert not wait_gone(str(run_dir), 5.0)


def test_one_process_runs_without_jax_distributed_with_the_same_outputs(tmp_path):
    # One process skips jax.distributed.initialize (its pmean stays in-process: the
    # distributed runtime put it on gloo at a third of the speed); the plan is still
    # checked and every output is written: params, TensorBoard with the per-process
    # step time, checkpoints. (And train.compilation_cache false: no cache, said so.)
    run_dir = tmp_path / "run"
    args = ("jobs/linear.yaml", "--run-dir", str(run_dir), "--set", "cluster.num_processes=1",
            "--set", "cluster.devices_per_process=4", "--set", "train.num_steps=30",
            "--set", "checkpoint.every_steps=10", "--set", "train.compilation_cache=false")
    result = launch(*args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert re.search(r"^\[p0\] compilation cache: 0 hits, [1-9]\d* misses; first step \(trace, compile, "
                     r"dispatch\) \d+\.\d{3} s \(off\)$", result.stdout, re.M), result.stdout[-3000:]
    assert not (run_dir / "compilation-cache").exists()
    assert "one process, in-process collectives (no jax.distributed)" in result.stdout
    assert "joined" not in result.stdout
    assert [s for s, _ in read_own_step_times(str(run_dir / "tensorboard"))[0]] == [10, 20, 30]
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["step-0000010", "step-0000020",
                                                           "step-0000030"]
    reference = numpy_gradient_descent(steps=30, lr=0.1)
    for got, want in zip(read_params(run_dir), reference):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_fused_steps_the_packed_all_reduce_and_jit_give_the_same_params(tmp_path):
    # 2 processes x 2 devices, 4 batches per epoch, so a call of 3 steps wraps the epoch
    # mid-call; every variant must give k=1 per-leaf pmean's params (the seed's step).
    finals = {}
    for k, allreduce, parallelism in [(1, "per_leaf", "pmap"), (1, "packed", "pmap"),
                                      (3, "per_leaf", "pmap"), (3, "packed", "pmap"),
                                      (3, "packed", "jit")]:
        variant = (k, allreduce, parallelism)
        run_dir = tmp_path / f"k{k}-{allreduce}-{parallelism}"
        result = launch("jobs/linear.yaml", "--run-dir", str(run_dir),
                        "--set", "train.num_steps=30", "--set", "data.num_examples=1024",
                        "--set", f"train.steps_per_call={k}", "--set", f"train.allreduce={allreduce}",
                        "--set", f"train.parallelism={parallelism}",
                        "--set", "logging.log_every_steps=6", "--set", "checkpoint.every_steps=12")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        finals[variant] = read_params(run_dir)
        if k == 3:
            assert "4 batches of [2, 64, 4] x" in result.stdout and "3 steps per call" in result.stdout
            scalars = read_scalars(str(run_dir / "tensorboard"))
            assert [s for s, _ in scalars["loss"]] == [6, 12, 18, 24, 30]
            assert [s for s, _ in read_own_step_times(str(run_dir / "tensorboard"))[1]] == \
                [6, 12, 18, 24, 30]
            assert sorted(os.listdir(run_dir / "checkpoints"))[-1] == "step-0000030"
        if parallelism == "jit":  # the checkpoint holds the replicated state once, as pmap's does
            with np.load(run_dir / "checkpoints" / "step-0000030" / "state.npz") as saved, \
                    np.load(tmp_path / "k3-packed-pmap" / "checkpoints" / "step-0000030"
                            / "state.npz") as pmap_saved:
                assert {n: saved[n].shape for n in saved.files} == \
                    {n: pmap_saved[n].shape for n in pmap_saved.files}
    for variant, params in finals.items():
        for got, want in zip(params, finals[(1, "per_leaf", "pmap")]):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, err_msg=str(variant))


def test_log_steps_inside_a_fused_call_are_logged_with_their_own_values(tmp_path):
    # log steps need not be call boundaries: a call of 10 steps keeps a row of metrics every
    # gcd(10, 4) = 2 steps, and each log step (4, 8, ..., 28, and the last, 30) is logged from
    # its own row, with k=1's values; params and checkpoints as k=1's
    logged, finals = {}, {}
    for k, parallelism in [(1, "pmap"), (10, "pmap"), (10, "jit")]:
        run_dir = tmp_path / f"k{k}-{parallelism}"
        result = launch("jobs/linear.yaml", "--run-dir", str(run_dir),
                        "--set", "train.num_steps=30", "--set", "data.num_examples=1024",
                        "--set", f"train.steps_per_call={k}", "--set", f"train.parallelism={parallelism}",
                        "--set", "logging.log_every_steps=4", "--set", "checkpoint.every_steps=10")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        scalars = read_scalars(str(run_dir / "tensorboard"))
        assert [s for s, _ in scalars["loss"]] == [4, 8, 12, 16, 20, 24, 28, 30]
        own = read_own_step_times(str(run_dir / "tensorboard"))
        assert [s for s, _ in own[1]] == [4, 8, 12, 16, 20, 24, 28, 30]
        assert all(v > 0 for _, v in own[0])
        logged[k, parallelism] = {n: [v for _, v in scalars[n]] for n in ("loss", "grad_norm", "param_norm")}
        finals[k, parallelism] = read_params(run_dir)
        assert sorted(os.listdir(run_dir / "checkpoints")) == ["step-0000010", "step-0000020",
                                                               "step-0000030"]
    for variant in [(10, "pmap"), (10, "jit")]:
        for name, values in logged[variant].items():
            np.testing.assert_allclose(values, logged[1, "pmap"][name], rtol=1e-5, err_msg=name)
        for got, want in zip(finals[variant], finals[1, "pmap"]):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, err_msg=str(variant))
