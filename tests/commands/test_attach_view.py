"""``launch attach`` shows the same live view as the foreground (issue 70, item 2): on a
terminal, the run's progress line redrawn in place (it redrew none), step lines at the
foreground's pace; Ctrl-C leaves the run running. Real launcher, real JAX workers."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import struct
import subprocess
import termios
import time

import pytest

from harness.detached import launch, step, supervisor, supervisors, until  # noqa: F401 (a fixture)
from harness.helpers import LAUNCH, REPO, env_for_tests
from launcher.console import CLEAR_LINE

pytestmark = pytest.mark.slow  # real workers


def _read_for(master: int, seconds: float, into: bytearray) -> None:
    import select

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            into += data


def test_attach_on_a_terminal_redraws_the_progress_line_and_paces_step_lines(
        tmp_path, supervisors):
    run_dir = tmp_path / "run"
    started = launch("jobs/linear.yaml", "--set", "train.num_steps=1000000", "--set",
                     "logging.log_every_steps=10", "--set", "task.name=faulty_task:make",
                     "--set", "task.args.sleep_s=0.02", "--run-dir", str(run_dir), "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    supervisors.append(supervisor(run_dir))
    until(lambda: step(run_dir) >= 20, "a first logged step")
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    attached = subprocess.Popen(LAUNCH + ["attach", str(run_dir)], cwd=REPO, env=env_for_tests(),
                                stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                                close_fds=True)
    os.close(slave)
    raw = bytearray()
    try:
        _read_for(master, 8.0, raw)
        attached.send_signal(signal.SIGINT)
        _read_for(master, 10.0, raw)
        assert attached.wait(timeout=30) == 0  # left; the run goes on
    finally:
        os.close(master)
        if attached.poll() is None:
            attached.kill()
    assert supervisor(run_dir) is not None
    stopped = launch("stop", str(run_dir), timeout_s=300)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    text = bytes(raw).decode("utf-8", "replace")
    redraws = set(re.findall(re.escape(CLEAR_LINE) + r"(\d+/\d+ running \| step \d+/1000000[^\r\n\x1b]*)",
                             text))
    assert len(redraws) >= 3, text[-3000:]  # redrawn in place, as the run went on
    assert all(len(line) <= 99 for line in redraws), redraws  # it fits 100 columns
    plain = text.replace(CLEAR_LINE, "\n").replace("\r\n", "\n")
    assert not re.search(r"^podlaunch: \d+/\d+ running", plain, re.M), plain[-3000:]  # not as lines
    steps = re.findall(r"^\[p0\] step (\d+)/1000000", plain, re.M)
    # 8 s watched: at the foreground's pace, one every 2 s (the last 20 lines of the log first)
    assert 2 <= len(steps) <= 8, plain[-3000:]
    assert plain.count("step lines on this terminal") == 1, plain[-3000:]
    assert "launch attach: left; the run goes on" in plain
