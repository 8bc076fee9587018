"""``launch tensorboard`` as a user opens it: a run served on a free port with every point,
and a quiet console (issue 50: TensorBoard's own messages, the profile plugin's access log
among them, go to a file it names)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import urllib.parse
import urllib.request

import pytest

from harness.helpers import LAUNCH, REPO, Output, env_for_tests


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
        match = re.match(r"podlaunch: TensorBoard of (\S+) at (http://localhost:\d+/) ", line)
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
