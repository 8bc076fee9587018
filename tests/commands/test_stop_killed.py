"""``launch stop RUN`` of a detached run whose supervisor was SIGKILLed stops what runs: the run
is taken back (each process proven by the run's secret) and stopped in order, its agreed step
saved, nothing left. Real launcher, real JAX workers, the local backend."""

from __future__ import annotations

import os
import re
import signal

import pytest

from harness.detached import launch, step, supervisor, supervisors, until  # noqa: F401 (a fixture)
from harness.helpers import run_pids
from launcher import proctl

pytestmark = pytest.mark.slow  # real workers


def _start_detached(run_dir) -> None:
    """A detached run that goes on until stopped (1,000,000 steps, process 0 paced 20 ms)."""
    started = launch("jobs/linear.yaml", "--set", "train.num_steps=1000000", "--set",
                     "logging.log_every_steps=20", "--set", "task.name=faulty_task:make",
                     "--set", "task.args.sleep_s=0.02", "--run-dir", str(run_dir), "--detach")
    assert started.returncode == 0, started.stdout + started.stderr


def test_stop_of_a_run_whose_supervisor_was_killed_stops_every_process_with_the_agreed_step_saved(
        tmp_path, supervisors):
    """Also issue 70, item 2: the take-back prints what it does, not the workers' lines."""
    run_dir = tmp_path / "run"
    _start_detached(run_dir)
    killed = supervisor(run_dir)
    supervisors.append(killed)
    workers = until(lambda: (lambda p: p if len(p) == 2 else None)(run_pids(str(run_dir))),
                    "both workers")
    until(lambda: step(run_dir) >= 20, "a first logged step")
    os.kill(killed, signal.SIGKILL)
    until(lambda: proctl.state(killed) in (None, "Z"), "the supervisor gone")
    assert sorted(run_pids(str(run_dir))) == sorted(workers)  # they train on, unwatched
    stopped = launch("stop", str(run_dir), timeout_s=300)
    supervisors.append(supervisor(run_dir))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "taking the run back to stop it in order" in stopped.stdout
    assert "every process is gone (state interrupted)" in stopped.stdout
    # what matters, not a replay (issue 70: about 60 step lines came first): no worker line,
    # and the take-back's words without "what they printed meanwhile follows"
    assert not re.search(r"^\[p\d", stopped.stdout, re.M), stopped.stdout
    assert "what they printed meanwhile follows" not in stopped.stdout
    assert "[p0] step " in (run_dir / "launcher.log").read_text()  # the log has every line
    assert run_pids(str(run_dir)) == []
    assert re.search(r"checkpoint of step \d+ saved",
                     (run_dir / "logs" / "process-000.log").read_text())
    waited = launch("wait", str(run_dir), timeout_s=60)
    assert waited.returncode == 130 and "the run interrupted (exit code 130)" in waited.stdout


def test_stop_of_a_run_whose_supervisor_is_stopped_continues_it_and_it_stops_the_run(
        tmp_path, supervisors):
    # a supervisor stopped by SIGSTOP (a ^Z'd shell's job, a debugger) never acted on the
    # SIGTERM: the stop waited out its timeout and left the run stopped
    run_dir = tmp_path / "run"
    _start_detached(run_dir)
    pid = supervisor(run_dir)
    supervisors.append(pid)
    until(lambda: step(run_dir) >= 20, "a first logged step")
    os.kill(pid, signal.SIGSTOP)
    until(lambda: proctl.is_stopped(pid), "the supervisor stopped")
    stopped = launch("stop", str(run_dir), "--timeout", "120", timeout_s=300)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"the run's supervisor (pid {pid}) was stopped (SIGSTOP); continued" in stopped.stdout
    assert "every process is gone (state interrupted)" in stopped.stdout
    # what matters, not a replay (issue 70: about 60 step lines came first): no worker line,
    # and the take-back's words without "what they printed meanwhile follows"
    assert not re.search(r"^\[p\d", stopped.stdout, re.M), stopped.stdout
    assert "what they printed meanwhile follows" not in stopped.stdout
    assert "[p0] step " in (run_dir / "launcher.log").read_text()  # the log has every line
    assert run_pids(str(run_dir)) == []
