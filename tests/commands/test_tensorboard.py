"""``launch tensorboard`` as a user opens it: a run served on a free port with every point,
and a quiet console (issue 50: TensorBoard's own messages, the profile plugin's access log
among them, go to a file it names)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from harness.helpers import LAUNCH, REPO, Output, env_for_tests
from harness.nosockets import SAID, loopback_down, no_socket_env


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_launch_tensorboard_serves_a_run_on_a_free_port(tmp_path):
    from worker.telemetry.tracker import make_tracker

    run_dir = tmp_path / "run"
    tracker = make_tracker(str(run_dir), 0, True)
    for step in range(1, 3001):  # more than TensorBoard's 1,000-point reservoir keeps by default
        tracker.scalars(step, {"loss": 1.0 / step})
    tracker.close()
    proc = subprocess.Popen(LAUNCH + ["tensorboard", str(run_dir)], cwd=REPO, env=env_for_tests(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)
    out = Output.of(proc)
    try:
        line = out.wait_for(r"^podlaunch: TensorBoard of ", 120)
        match = re.match(r"podlaunch: TensorBoard of (\S+) at (http://localhost:\d+/)"
                         r"#custom_scalars ", line)
        assert match and match.group(1) == str(run_dir / "tensorboard"), line
        with urllib.request.urlopen(match.group(2) + "data/plugin/scalars/tags", timeout=30) as reply:
            tags = json.load(reply)
        (name,) = tags  # one run, under a readable name (when it started), not "."
        assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$", name), tags
        assert "loss" in tags[name]
        # every logged point is served: a loss spike cannot vanish into the sampling
        query = urllib.parse.urlencode({"tag": "loss", "run": name})
        with urllib.request.urlopen(match.group(2) + "data/plugin/scalars/scalars?" + query,
                                    timeout=30) as reply:
            points = json.load(reply)
        assert [p[1] for p in points] == list(range(1, 3001))
    finally:
        proc.send_signal(signal.SIGINT)
        code, text = out.finish(30)
    # a quiet console (issue 50): TensorBoard's start-up lines and access log are in its file
    assert code == 0 and all(line.startswith("podlaunch: ") for line in text.splitlines()), text


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tensorboard_of_a_run_without_events_says_so_and_serves(tmp_path):
    # it served an empty page without a word (a run with logging.tensorboard: false)
    run_dir = tmp_path / "run"
    (run_dir / "tensorboard").mkdir(parents=True)
    (run_dir / "spec.yaml").write_text("name: linear\n")
    proc = subprocess.Popen(LAUNCH + ["tensorboard", str(run_dir)], cwd=REPO, env=env_for_tests(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)
    out = Output.of(proc)
    try:
        out.wait_for(r"^podlaunch: TensorBoard of ", 120)
    finally:
        proc.send_signal(signal.SIGINT)
        code, text = out.finish(30)
    assert code == 0, text
    assert f"podlaunch: no TensorBoard events in {run_dir / 'tensorboard'} yet (a run with " \
           "logging.tensorboard: false writes none" in text, text
    assert text.index("no TensorBoard events") < text.index("podlaunch: TensorBoard of ")


# A host without a network (harness.nosockets): the launcher says what needed the port and
# why it cannot have it, at once. It was a traceback from proctl.free_port (no socket), and
# with the loopback down a 60 s wait for a server that could never answer.
@pytest.mark.parametrize("errno_name", sorted(SAID))
@pytest.mark.parametrize("port", [None, "6123"])
def test_tensorboard_where_no_tcp_socket_can_be_opened_is_a_sentence(tmp_path, errno_name, port):
    (tmp_path / "run" / "tensorboard").mkdir(parents=True)
    args = ["tensorboard", str(tmp_path / "run")] + (["--port", port] if port else [])
    done = subprocess.run(LAUNCH + args, cwd=REPO, env=no_socket_env(tmp_path, errno_name),
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "launch: TensorBoard's server needs a TCP port on 127.0.0.1, and this machine allows " \
           f"no TCP socket ({SAID[errno_name]}): a sandbox or locked-down host; " in done.stderr
    assert ("pass --port PORT" in done.stderr) is (port is None)  # a given port: no use saying it
    assert "Traceback" not in done.stderr


def test_tensorboard_on_a_host_whose_loopback_is_down_is_refused_at_once(tmp_path):
    (tmp_path / "run" / "tensorboard").mkdir(parents=True)
    began = time.monotonic()
    done = subprocess.run(loopback_down() + LAUNCH + ["tensorboard", str(tmp_path / "run")],
                          cwd=REPO, env=env_for_tests(), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"launch: TensorBoard's server at 127\.0\.0\.1:\d+ cannot be reached from "
                     r"this host \(Network is unreachable, errno 101\): the loopback interface "
                     r"is down", done.stderr), done.stderr
    assert "did not answer" not in done.stderr and time.monotonic() - began < 30


def _a_run(root, name: str, spec: str, backend: str, losses: list) -> None:
    """A run directory of job ``linear`` as a launch leaves it: spec.yaml, run.json and the
    events process 0 writes for two processes (through the worker's own tracker)."""
    from worker.telemetry.tracker import make_tracker

    run_dir = root / "linear" / name
    tracker = make_tracker(str(run_dir), 0, True)
    for step, loss in enumerate(losses, start=1):
        tracker.scalars(step, {"loss": loss, "step_time_s": 0.01,
                               "step_time_s/process_000": 0.002,
                               "step_time_s/process_001": 0.004 + step * 1e-4})
    tracker.close()
    (run_dir / "spec.yaml").write_text(f"name: linear\n{spec}")
    (run_dir / "run.json").write_text(json.dumps({
        "job": "linear", "state": "succeeded", "backend": backend,
        "started": f"2026-12-07T10:0{len(name)}:00"}))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tensorboard_opens_on_the_loss_then_each_processs_own_step_time_a_colour_each(tmp_path):
    """The first view answers first (issue 62): the printed URL opens the Custom Scalars tab,
    whose first chart is the loss and second every process's own step time, one run per
    process (TensorBoard colours lines by run; as tags of one run they shared a colour); runs
    are named by what differs, a setting left to its default as ``default`` (not ``None``),
    a rehearsal as one (not by its three cluster settings). Looked at once in headless
    Chromium (2026-12-07): the tab opens with the loss and the own step times side by side,
    each process's line in its run's colour."""
    root = tmp_path / "runs"
    _a_run(root, "a", "optimizer:\n  momentum: null\n", "local", [1.0, 0.5, 0.25])
    _a_run(root, "bb", "optimizer:\n  momentum: 0.9\n", "local", [1.0, 0.4, 0.2])
    _a_run(root, "ccc", "optimizer:\n  momentum: null\ncluster:\n  backend: tpu\n  "
           "tpu_name: my-pod\n  zone: us-east5-a\n", "tpu-rehearsal", [1.0, 0.5, 0.25])
    _a_run(root, "dddd", "optimizer:\n  momentum: null\n", "local", [1.0, 0.5, 0.3])
    proc = subprocess.Popen(LAUNCH + ["tensorboard", "linear", "--root", str(root)], cwd=REPO,
                            env=env_for_tests(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    out = Output.of(proc)
    try:
        line = out.wait_for(r"^podlaunch: TensorBoard of ", 120)
        url = re.search(r"at (http://localhost:\d+/)#custom_scalars \(Ctrl-C stops it\)$",
                        line).group(1)
        said = out.wait_for(r"^podlaunch: it opens on ", 30)
        assert ("the loss, any metric of the job's own (accuracy), then each process's own step "
                f"time, a colour each; every scalar: {url}#timeseries;") in said, said
        with urllib.request.urlopen(url + "data/plugin/custom_scalars/layout", timeout=30) as reply:
            layout = json.load(reply)
        charts = [chart for category in layout["category"] for chart in category["chart"]]
        assert [c["title"] for c in charts][:2] == ["loss", "own step time of each process (s)"]
        with urllib.request.urlopen(url + "data/plugin/scalars/tags", timeout=30) as reply:
            tags = json.load(reply)
        names = sorted(run for run in tags if "/" not in run)
        assert names == ["2026-12-07 10:01:00", "2026-12-07 10:02:00 optimizer.momentum=0.9",
                         "2026-12-07 10:03:00 rehearsal",
                         "2026-12-07 10:04:00"], names
        for name in names:  # each process a run of its own, its own step time its one tag
            assert sorted(run for run in tags if run.startswith(name + "/")) == \
                [f"{name}/process_000", f"{name}/process_001"], tags
            assert set(tags[f"{name}/process_001"]) == {"own_step_time_s"}
            assert "loss" in tags[name] and not any(t.startswith("step_time_s/") for t in tags[name])
    finally:
        proc.send_signal(signal.SIGINT)
        code, text = out.finish(30)
    assert code == 0, text
