"""Seeing a run: the status line, --show, the summary table, TensorBoard, metrics.jsonl.

The fast tests drive the launcher-side pieces directly; the slow ones run the
real CLI (real JAX processes) and read the event files back with
TensorBoard's own reader.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import struct
import subprocess
import sys
import termios
import time
import types

import numpy as np
import pytest

from harness.helpers import (LAUNCH, REPO, custom_scalars_layout, env_for_tests, event_files, launch,
                             read_own_step_times, read_plugin_data, read_scalars, read_text)
from launcher.errors import SpecError
from launcher.plan import ProcessPlan
from launcher.console import CLEAR_LINE, StatusLine
from launcher.ends import Exited, Killed
from launcher.state import Result, State, Tracked
from launcher.stats import ProcessStats
from launcher.console.status import parse_show, status_text, summary
from worker.contract import wire

LOGGED = ("loss", "learning_rate", "grad_norm", "param_norm", "step_time_s", "examples_per_s")


# ---- fast: launcher-side pieces ------------------------------------------------
def test_show_accepts_ids_ranges_all_and_none_and_echoes_bad_parts():
    assert parse_show("0") == {0}
    assert parse_show("0,3-5") == {0, 3, 4, 5}
    assert parse_show("all") is None and parse_show("none") == frozenset()
    for bad in ("x", "3-1", "1,,2", "-2"):
        with pytest.raises(SpecError) as err:
            parse_show(bad)
        assert "--show" in str(err.value.problems[0]) and "0,3-5" in str(err.value.problems[0])


def test_progress_lines_round_trip():
    line = wire.PROGRESS_FORMAT.format(step=40, num_steps=100, loss=0.0123, steps_per_s=81.25,
                                           step_time_s=0.0123, own_step_time_s=0.00042)
    got = wire.parse(line)
    assert got == wire.Progress(40, 100, 0.0123, 81.2, 0.0123, 0.00042)
    assert wire.parse(line).step == 40 and got.text() == line
    old = wire.parse("step 7/9 loss nan | 3.0 steps/s")  # a worker without step times
    assert old.step == 7 and np.isnan(old.loss) and old.own_step_time_s is None
    assert wire.parse("[Gloo] step 3/4") == wire.Other("[Gloo] step 3/4")  # no progress


def test_progress_lines_carry_the_jobs_own_metrics_after_the_loss():
    """A task's metrics (digits' accuracy) and a program's scalars ride on the step line, a
    name and a value each after the loss, at most ``SHOWN_METRICS``, names made one word."""
    values = {"loss": 0.21, "grad_norm": 1.5, "param_norm": 3.0, "accuracy": 0.93359375}
    own = wire.own_metrics(values)
    assert own == (("accuracy", 0.93359375),)  # the step's own norms are not the task's
    line = wire.Progress(50, 300, 0.219812, 45.3, 0.0220757, 0.0108214, own).text()
    assert line == ("step 50/300 loss 0.219812 accuracy 0.9336 | 45.3 steps/s | step_time_s "
                    "0.0220757 (own 0.0108214)")
    assert wire.parse(line) == wire.Progress(50, 300, 0.219812, 45.3, 0.0220757, 0.0108214,
                                             (("accuracy", 0.9336),))
    many = tuple((f"m {n}|x", n / 10) for n in range(6))
    shown = wire.parse(wire.Progress(1, 2, 0.5, 3.0, 0.1, 0.1, many).text())
    assert shown.metrics == tuple((f"m_{n}_x", n / 10) for n in range(wire.SHOWN_METRICS))
    assert shown.steps_per_s == 3.0 and shown.own_step_time_s == 0.1
    assert wire.parse("step 1/2 loss 0.5 accuracy high | 3.0 steps/s") == \
        wire.Other("step 1/2 loss 0.5 accuracy high | 3.0 steps/s")  # not a number: not ours


def test_mean_step_time_of_a_resumed_attempt_counts_from_its_checkpoint():
    lines = [wire.RESUMED_FORMAT.format(step=1000, attempt=1, seconds=0.5),
             _progress(1010, 0.0, step_time_s=0.02), _progress(1020, 0.0, step_time_s=0.04)]
    stats = ProcessStats()
    for line in lines:
        stats.observe(line)
    assert stats.timed_steps == 20  # steps 1001-1020, not 1020
    assert stats.mean_step_time_s == pytest.approx(0.03)
    fresh = ProcessStats()
    for line in lines[1:]:
        fresh.observe(line)
    assert fresh.timed_steps == 1020  # a fresh run's first interval starts at step 1


def _tracked(process_id, host="localhost", lines=(), state=State.RUNNING, exit=None):
    plan = ProcessPlan(process_id=process_id, host=host, local_device_count=1, env={}, argv=(),
                       log_path=f"/tmp/process-{process_id:03d}.log",
                       label=f"p{process_id}" if host == "localhost" else f"p{process_id} {host}")
    t = Tracked(types.SimpleNamespace(plan=plan), state=state, exit=exit)
    for line in lines:
        t.stats.observe(line)
        t.last_step = getattr(wire.parse(line), "step", None) or t.last_step
    return t


def _progress(step, own_s, step_time_s=0.05, num_steps=100):
    return wire.PROGRESS_FORMAT.format(step=step, num_steps=num_steps, loss=0.5,
                                           steps_per_s=1 / step_time_s, step_time_s=step_time_s,
                                           own_step_time_s=own_s)


def test_status_line_names_the_process_with_the_largest_own_step_time():
    tracked = [_tracked(0, lines=[_progress(40, 0.002)]),
               _tracked(1, "host-b", [_progress(40, 0.049)]),
               _tracked(2, lines=[_progress(40, 0.001)], state=State.SUCCEEDED)]
    # 60 steps left at 50 ms a step: ETA 3 s
    assert status_text(tracked) == ("2/3 running | step 40/100 | ETA 3.0s | loss 0.5 | 20.0 steps/s | "
                                    "slowest p1 host-b (own 49 ms/step; median 25.5)")
    tracked.append(_tracked(3))  # running, nothing logged yet: it is the slowest
    assert status_text(tracked).endswith("slowest p3 (no step logged yet)")
    assert status_text([_tracked(0)]) == "1/1 running | waiting for the first logged step"
    assert status_text([_tracked(0)], elapsed_s=75) == \
        "1/1 running | elapsed 1m15s | waiting for the first logged step"


def test_status_line_redraws_in_place_on_a_terminal_and_prints_plain_lines_otherwise():
    now = [0.0]
    out = io.StringIO()
    line = StatusLine(out, tty=True, redraw_every_s=0.2, clock=lambda: now[0])
    line.update("one")
    line.write("[p0] hello\n")  # a worker line goes above the status line, which is redrawn
    now[0] = 0.1
    line.update("two")  # too soon: skipped
    now[0] = 0.3
    line.update("three")
    line.end()
    assert out.getvalue() == (CLEAR_LINE + "one" + CLEAR_LINE + "[p0] hello\n" + "one"
                              + CLEAR_LINE + "three" + CLEAR_LINE)

    out, now[0] = io.StringIO(), 0.0
    plain = StatusLine(out, tty=False, status_every_s=5.0, clock=lambda: now[0])
    for t in (0.0, 1.0, 5.0, 6.0, 10.5):
        now[0] = t
        plain.update(f"at {t}")
    plain.write("[p0] hello\n")
    plain.end()
    assert out.getvalue() == ("podlaunch: status: at 5.0\npodlaunch: status: at 10.5\n"
                              "[p0] hello\n")


def test_summary_table_columns_stay_aligned_with_a_long_state():
    failed = _tracked(2, "host-long-name", [_progress(5, 0.01, 0.02)], State.FAILED, Killed(9))
    ok = _tracked(0, lines=[_progress(5, 0.01, 0.02), _progress(10, 0.01, 0.04)],
                  state=State.STOPPED, exit=Exited(143))
    text = summary(Result([ok, failed], failed, False, 3.0))
    table = text.splitlines()[-3:]
    assert table[0].split() == ["process", "host", "state", "exit", "steps", "step", "ms",
                                "first", "s", "cache"]
    assert re.match(r"^p2 +host-long-name +failed \(first\) +killed by SIGKILL +5 +20\.000 +- +-$", table[2])
    assert re.match(r"^p0 +localhost +stopped +exit code 143 +10 +30\.000 +- +-$", table[1])
    starts = {row.index(word) for row, word in zip(table, ("exit", "exit code", "killed"))}
    assert len(starts) == 1, table  # the exit column starts at the same place in every row


def test_summary_reports_each_process_compilation_and_the_attempts_slowest():
    from launcher.run import restarts

    def cache(hits, misses, seconds):
        return wire.CACHE_FORMAT.format(hits=hits, misses=misses, seconds=seconds, path="/r/cc")

    done = [_progress(10, 0.01, num_steps=10)]
    first = [_tracked(0, lines=[cache(0, 4, "1.250")] + done, state=State.SUCCEEDED, exit=Exited(0)),
             _tracked(1, "host-b", [cache(0, 4, "2.500")] + done, State.SUCCEEDED, Exited(0))]
    again = [_tracked(0, lines=[cache(4, 0, "0.110")] + done, state=State.SUCCEEDED, exit=Exited(0)),
             _tracked(1, "host-b", [cache(0, 4, "?")] + done, State.SUCCEEDED, Exited(0))]
    text = summary(Result(again, None, False, 3.0)).splitlines()
    assert re.match(r"^p0 +localhost +succeeded +exit code 0 +10 +50\.000 +0\.110 +4/0$", text[1])
    assert re.match(r"^p1 +host-b +succeeded +exit code 0 +10 +50\.000 +- +0/4$", text[2])
    assert text[3] == "compilation: first step up to 0.110 s (p0); cache 4 hits, 4 misses over 2 processes"
    attempts = [restarts.Attempt(0, "/r/logs", Result(first, None, False, 3.0)),
                restarts.Attempt(1, "/r/logs/attempt-1", Result(again, None, False, 3.0))]
    table = restarts.attempts_table(attempts)
    assert ("compilation: first step up to 2.500 s (p1 host-b); cache 0 hits, 8 misses over "
            "2 processes") in table, table
    assert "compilation: first step up to 0.110 s (p0); cache 4 hits, 4 misses" in table
    # no cache line (a program, an older worker): no compilation line, dashes in the table
    assert "compilation" not in summary(Result([_tracked(0, lines=done)], None, False, 1.0))


def test_a_success_after_a_take_back_or_resume_says_the_runs_seconds_beside_this_launchs():
    """Issue 70: after a take-back the summary said ``OK ... in 15.2s`` (this launch's) above
    ``the run's 98.6 s`` (the ledger's, every launch): a success says both where they differ,
    and its own alone where they do not."""
    done = [_progress(50, 0.001, num_steps=100), _progress(100, 0.001, num_steps=100)]
    result = Result([_tracked(0, lines=done, state=State.SUCCEEDED, exit=Exited(0))], None,
                    False, 15.24)
    ok = [line for line in summary(result, 98.6).splitlines() if line.startswith("OK:")]
    assert ok == ["OK: 1 process succeeded in the run's 98.6 s, 15.2 s of them this launch's."]
    for run_s in (None, 15.9, 16.1):  # one launch: its ledger's wall is its own, near enough
        assert "OK: 1 process succeeded in 15.2s." in summary(result, run_s).splitlines()


def test_launch_tensorboard_names_the_install_command_when_it_is_missing(tmp_path):
    code = ("import sys; sys.modules['tensorboard'] = None\n"
            "from launcher.cli import main; main(['tensorboard', sys.argv[1]])")
    result = subprocess.run([LAUNCH[0], "-c", code, str(tmp_path)], env=env_for_tests(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "TensorBoard is not installed" in result.stderr
    # the launcher's own Python's pip: a plain `pip` may be the system's when the venv is not
    # activated (a new user installed into the wrong Python)
    # and one that works from any directory (issue 70: '.[tensorboard]' works only in the clone)
    assert f"install it with: {LAUNCH[0]} -m pip install tensorboard, then run this again" \
        in result.stderr and "-e" not in result.stderr, result.stderr


# ---- slow: real runs ----------------------------------------------------------
def reference_norms(steps: int, lr: float = 0.1):
    """Full-batch gradient descent on the seed's data in float64: per step ‖g‖ and ‖params‖ after."""
    import jax

    from worker.data.sources import synthetic_rows
    from worker.tasks import init_linear

    x, y = (a.astype(np.float64) for a in synthetic_rows(1, 4, 1, 0.1, 0, 256))
    w, b = (np.asarray(a, np.float64) for a in init_linear(jax.random.PRNGKey(0), 4, 1))
    grad_norms, param_norms = [], []
    for _ in range(steps):
        residual = x @ w + b - y
        gw, gb = (2.0 / 256) * (x.T @ residual), (2.0 / 256) * residual.sum(axis=0)
        grad_norms.append(np.sqrt((gw ** 2).sum() + (gb ** 2).sum()))
        w, b = w - lr * gw, b - lr * gb
        param_norms.append(np.sqrt((w ** 2).sum() + (b ** 2).sum()))
    return grad_norms, param_norms


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_2x2_run_logs_every_tag_and_per_process_curve_and_matching_metrics_jsonl(tmp_path,
                                                                                   own_compilation_cache):
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--run-dir", str(run_dir), "--set", "train.num_steps=20",
                    "--set", "logging.log_every_steps=5", "--show", "1", "--status-every", "0.2")
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr
    # --show 1: only p1's lines on the console, every line in every log file
    assert re.search(r"^\[p1\] step 20/20 loss", out, re.M) and "[p0]" not in out
    assert "step 20/20 loss" in (run_dir / "logs" / "process-000.log").read_text()
    # piped: plain status lines, never a terminal redraw
    assert re.search(r"^podlaunch: status: \d/2 running \| ", out, re.M) and "\r" not in out
    table = out[out.index("process  host"):].splitlines()
    assert table[0].split() == ["process", "host", "state", "exit", "steps", "step", "ms",
                                "first", "s", "cache"]
    for process_id in (0, 1):  # a fresh run directory: its compilation cache starts empty
        assert re.match(rf"^p{process_id} +localhost +succeeded +exit code 0 +20 +\d+\.\d{{3}} "
                        r"+\d+\.\d{3} +0/[1-9]\d*$", table[1 + process_id]), table
    assert re.match(r"^compilation: first step up to \d+\.\d{3} s \(p[01]\); cache 0 hits, "
                    r"[1-9]\d* misses over 2 processes$", table[3]), table

    logdir = str(run_dir / "tensorboard")
    # process 0 alone writes the job's; the launcher, the goodput ledger's, in the same run
    assert sorted(os.path.basename(f).rsplit(".", 1)[1] for f in event_files(str(run_dir))
                  if os.path.dirname(f) == logdir) == ["goodput", "process-000"], \
        event_files(str(run_dir))
    # and each process's own step times in a run of its own (process_NNN), by process 0 too
    assert len(event_files(str(run_dir))) == 4
    scalars = read_scalars(logdir)
    own = read_own_step_times(logdir)
    steps = [5, 10, 15, 20]
    per_process = ["step_time_s/process_000", "step_time_s/process_001"]  # metrics.jsonl's keys
    # the Custom Scalars tab: the loss first, every process's own step time on one chart (one
    # line per process's run: TensorBoard colours lines by run)
    charts = [chart for category in custom_scalars_layout(logdir).category for chart in category.chart]
    assert [chart.title for chart in charts][:2] == ["loss", "own step time of each process (s)"]
    assert re.match(charts[1].multiline.tag[0], "own_step_time_s")
    assert sorted(own) == [0, 1]
    for tag in LOGGED:
        assert [s for s, _ in scalars[tag]] == steps, tag
    for process_id in own:
        assert [s for s, _ in own[process_id]] == steps, process_id
    assert [s for s, _ in scalars["compile_time_s"]] == [5] and scalars["compile_time_s"][0][1] > 0
    assert scalars["final_loss"] == [scalars["loss"][-1]]
    grad_norms, param_norms = reference_norms(20)
    np.testing.assert_allclose([v for _, v in scalars["grad_norm"]], [grad_norms[s - 1] for s in steps],
                               rtol=1e-4)
    np.testing.assert_allclose([v for _, v in scalars["param_norm"]], [param_norms[s - 1] for s in steps],
                               rtol=1e-4)
    assert all(v == pytest.approx(0.1) for _, v in scalars["learning_rate"])
    for (_, examples), (_, step_time) in zip(scalars["examples_per_s"], scalars["step_time_s"]):
        assert examples == pytest.approx(256 / step_time, rel=1e-5)
    for values in own.values():  # host time outside JAX: a small part of a step here
        assert all(0 <= v < 0.5 for _, v in values), values

    text, session, experiment = read_plugin_data(logdir)
    assert json.loads("\n".join(line[4:] for line in text.splitlines()))["name"] == "linear"
    # what it trained on (on a TPU VM: 1 process x 4 tpu devices (TPU v5 lite))
    assert read_text(logdir, "devices") == "2 processes x 2 cpu devices (cpu)"
    assert session.hparams["optimizer.learning_rate"].number_value == pytest.approx(0.1)
    assert session.hparams["train.global_batch_size"].number_value == 256
    assert [m.name.tag for m in experiment.metric_infos] == ["final_loss"]

    records = [json.loads(line) for line in open(os.path.join(logdir, "metrics.jsonl"))]
    assert [r["step"] for r in records] == steps
    for record in records:
        for tag, value in record.items():
            if tag in per_process:  # the process's own run's
                got = dict(own[per_process.index(tag)])[record["step"]]
                assert got == pytest.approx(value, rel=1e-6), tag
            elif tag != "step":
                assert dict(scalars[tag])[record["step"]] == pytest.approx(value, rel=1e-6), tag
    # the job's tags (the launcher's goodput ledger, its own file in the run, has its own)
    assert {tag for r in records for tag in r} - {"step"} == {
        tag for tag in scalars if not tag.startswith("goodput/")} | set(per_process)


def launch_in_a_terminal(*args: str, timeout_s: float = 120, columns: int = 200) -> tuple[int, str]:
    """Run ``launch ARGS`` with a real pseudo-terminal of ``columns`` as its stdout/stderr;
    returns (code, output)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(LAUNCH + list(args), cwd=REPO, env=env_for_tests(), stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return code, b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_on_an_80_column_terminal_the_launchers_lines_fit_and_commands_stay_whole(tmp_path):
    """Issue 62: lines of about 90 characters wrapped at 80 columns wherever the last column
    fell. Every line the launcher writes fits (a worker's own lines are its own), but a
    command longer than the terminal, which is kept whole to be copied."""
    code, out = launch_in_a_terminal("jobs/linear.yaml", "--run-dir", str(tmp_path / "run"),
                                     "--set", "train.num_steps=20", columns=80)
    assert code == 0, out[-3000:]
    lines = [line.split(CLEAR_LINE)[-1] for line in out.replace("\r\n", "\n").split("\n")]
    ours = [line for line in lines if line and not line.startswith("[p")]
    assert any(line.startswith("podlaunch: goodput ") for line in ours), ours
    long = [line for line in ours if len(line) > 80]
    # longer than the terminal, alone on its line: a path (the test's run directory is long),
    # or a command, never cut
    assert all(" " not in line.strip() or re.match(r"^podlaunch:   \S*launch \S", line) or
               re.match(r"^ +\S*launch tensorboard \S+$", line) for line in long), long
    # the goodput sentence went on over several lines, each under its text
    at = next(i for i, line in enumerate(ours) if line.startswith("podlaunch: goodput "))
    assert ours[at + 1].startswith(" " * len("podlaunch: ")), ours[at:at + 3]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_straggler_has_the_slowest_curve_and_the_terminal_status_line_names_it(tmp_path):
    run_dir = tmp_path / "run"
    code, out = launch_in_a_terminal(
        "jobs/linear.yaml", "--run-dir", str(run_dir), "--set", "cluster.num_processes=2",
        "--set", "cluster.devices_per_process=1", "--set", "train.num_steps=40",
        "--set", "logging.log_every_steps=5", "--set", "task.name=faulty_task:make",
        "--set", "task.args.sleep_s=0.05", "--set", "task.args.slow_process_id=1")
    assert code == 0, out[-3000:]
    # redrawn in place: erase the line, then the status; the summary comes after it is erased
    drawn = re.findall(re.escape(CLEAR_LINE) + r"(2/2 running \| step \d+/40 [^\r\n\x1b]*)", out)
    assert any("slowest p1 (own" in d for d in drawn), drawn
    assert "podlaunch: status:" not in out  # no plain status lines on a terminal
    assert re.search(r"\[p0\] step 40/40 loss", out)
    own = read_own_step_times(str(run_dir / "tensorboard"))
    slow, fast = (dict(own[i]) for i in (1, 0))
    assert sorted(slow) == sorted(fast) == [5, 10, 15, 20, 25, 30, 35, 40]
    for step in slow:
        assert slow[step] > 0.04 and slow[step] > 3 * fast[step], (step, slow[step], fast[step])


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode,parallelism", [("stop", "pmap"), ("warn", "pmap"), ("stop", "jit")])
def test_a_non_finite_loss_names_its_step_and_stops_or_warns(tmp_path, mode, parallelism):
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--run-dir", str(run_dir), "--set", "cluster.num_processes=1",
                    "--set", "cluster.devices_per_process=1", "--set", "optimizer.learning_rate=100",
                    "--set", f"train.parallelism={parallelism}",
                    "--set", "train.num_steps=40", "--set", "logging.log_every_steps=1",
                    "--set", f"logging.on_nonfinite_loss={mode}")
    out = result.stdout
    records = [json.loads(line) for line in open(run_dir / "tensorboard" / "metrics.jsonl")]
    first_bad = next(r["step"] for r in records if r["loss"] is None)  # NaN/inf -> null
    losses = dict(read_scalars(str(run_dir / "tensorboard"))["loss"])
    assert not np.isfinite(losses[first_bad]) and np.isfinite(losses[first_bad - 1])
    if mode == "stop":
        assert result.returncode == 1, out[-3000:]
        assert re.search(rf"FloatingPointError: loss is (nan|inf) at step {first_bad} "
                         r"\(logging.on_nonfinite_loss: stop", out), out[-3000:]
        assert f"({'exit code 1'}) at step {first_bad}; it failed first." in out
        assert [r["step"] for r in records][-1] == first_bad
    else:
        # warn goes on to the last step; a run that ends there at nan diverged (issue 51.2)
        assert result.returncode == 1, out[-3000:]
        assert re.search(rf"warning: loss is (nan|inf) at step {first_bad}; continuing", out)
        assert [r["step"] for r in records][-1] == 40
        assert re.search(r"DIVERGED: every step ran, but the final loss is (nan|inf)", out)
        assert json.loads((run_dir / "run.json").read_text())["state"] == "diverged"


def test_tensorboardx_is_imported_without_the_cloud_clients_it_would_load():
    """tensorboardX imports google.cloud.storage when installed (xprof, the profile extra,
    installs it: this test environment has it), about 0.3 s of CPU on process 0 before its
    first step and in the launcher at every run's end, for gs:// directories podlaunch
    never writes. ``worker.telemetry.tracker.tensorboardx`` imports it without them; they stay
    importable for anyone else. In a fresh interpreter, as process 0 and the launcher are."""
    import importlib.util

    assert importlib.util.find_spec("google.cloud.storage") is not None, "the premise"
    code = ("import sys\n"
            "from worker.telemetry.tracker import tensorboardx\n"
            "tensorboardx()\n"
            "from tensorboardX import record_writer\n"
            "print(record_writer.GCS_ENABLED, 'google.cloud.storage' in sys.modules,\n"
            "      [k for k, v in sys.modules.items() if v is None])\n"
            "import google.cloud.storage\n"
            "print('importable')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env_for_tests(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False False []", "importable"], done.stdout


def test_a_background_tracker_writes_every_call_in_order_and_raises_its_writer_s_error(tmp_path):
    """The trainer's tracker writes on a thread of its own (``BackgroundTracker``): every
    record reaches TensorBoard (read back with its own reader) and metrics.jsonl, in step
    order, with the values of the call (a dict changed after it changes nothing), once
    ``close`` returns; a write that fails on the writer thread is raised by the loop's next
    call, and the calls after it are dropped."""
    from worker.contract.metrics import METRICS_FILE
    from worker.telemetry import tracker as trackers

    made = trackers.make_tracker(str(tmp_path), 0, True, background=True)
    assert isinstance(made, trackers.BackgroundTracker)
    made.layout(("accuracy", "top k"))  # the landing view: a chart of each after the loss
    made.layout(("ignored",))  # laid out once
    for step in range(1, 2001):
        values = {"loss": 1.0 / step, "step_time_s": 0.5}
        made.scalars(step, values)
        values["loss"] = -1.0  # after the call: not what is written
        if step % 100 == 0:
            made.flush()
    made.hparams({"lr": 0.1}, {"final_loss": 1.0 / 2000})
    made.close()
    scalars = read_scalars(str(tmp_path / "tensorboard"))
    assert scalars["loss"] == [(step, pytest.approx(1.0 / step)) for step in range(1, 2001)]
    lines = (tmp_path / "tensorboard" / METRICS_FILE).read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 2001))
    assert json.loads(lines[-1])["loss"] == pytest.approx(1.0 / 2000)
    charts = [chart for category in custom_scalars_layout(str(tmp_path / "tensorboard")).category
              for chart in category.chart]
    assert [chart.title for chart in charts] == ["loss", "accuracy", "top k",
                                                 "own step time of each process (s)",
                                                 "step time (s)", "goodput"]
    assert [re.fullmatch(chart.multiline.tag[0], tag) is not None
            for chart, tag in zip(charts[1:3], ("accuracy", "top k"))] == [True, True]

    class Full(trackers.NullTracker):
        written: list = []

        def scalars(self, step, values):
            if step == 2:
                raise OSError(28, "No space left on device", "events")
            self.written.append(step)

    failing = trackers.BackgroundTracker(Full())
    failing.scalars(1, {})
    failing.scalars(2, {})
    deadline = time.monotonic() + 30
    with pytest.raises(OSError, match="No space left"):
        while time.monotonic() < deadline:  # raised by the first call after the writer met it
            failing.scalars(3, {})
            time.sleep(0.01)
    failing.close()  # the error was raised once: close ends the writer without it
    assert Full.written == [1]


@pytest.mark.slow
def test_process_0_ending_itself_in_a_task_s_hook_keeps_every_step_it_logged(tmp_path):
    """A tester's report on the writer thread: process 0 ending hard in its task's hook at
    step 25 (os._exit) logged steps 1-25 on the console, but metrics.jsonl and TensorBoard
    stopped at 23: two records were still queued. The hook now waits for them. (One process:
    with several, process 0 holds a record until every process's step time is in, and one
    ending hard loses what it holds, as before.)"""
    from harness.helpers import NO_RESTARTS

    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--run-dir", str(run_dir), "--set", "train.num_steps=60",
                    "--set", "logging.log_every_steps=1", "--set", "cluster.num_processes=1",
                    "--set", "task.name=faulty_task:make", "--set", "task.args.crash_at_step=25",
                    "--set", "task.args.crash_process_id=0", "--set", "task.args.mode=exit",
                    *NO_RESTARTS)
    assert result.returncode == 1, result.stdout[-3000:]
    assert re.search(r"^\[p0\] step 25/60 ", result.stdout, re.M), result.stdout[-3000:]
    records = [json.loads(line) for line in open(run_dir / "tensorboard" / "metrics.jsonl")]
    assert [r["step"] for r in records] == list(range(1, 26))
    assert [step for step, _ in read_scalars(str(run_dir / "tensorboard"))["loss"]] == list(range(1, 26))


def test_a_resumed_launch_s_attempts_table_counts_the_run_s_attempts_too():
    # a new user resumed a stopped run: the summary said "attempts: 1 (0 restarts)" and listed
    # attempt 1, while `launch runs` said 2 attempts
    from launcher.run import restarts

    done = ["step 10/10 loss 0.5 | 20.0 steps/s | step_time_s 0.05 (own 0.01)", "done"]
    ok = Result([_tracked(0, lines=done, state=State.SUCCEEDED, exit=Exited(0))], None, False, 1.0)
    table = restarts.attempts_table([restarts.Attempt(1, "/r/logs/attempt-1", ok)])
    assert table.splitlines()[0] == "attempts: 1 (0 restarts) in this launch; 2 attempts in the run"
    fresh = restarts.attempts_table([restarts.Attempt(0, "/r/logs", ok)])
    assert fresh.splitlines()[0] == "attempts: 1 (0 restarts)"
