"""The process podlaunch was given, made sane (issue 71): a signal mask or ignored signals from
the runner that started it, a closed stdout or stderr.

Real launches of jobs/linear.yaml (2 processes x 1 CPU device), started the way such a runner
starts them: ``(trap '' TERM; launch ...)``, SIGTERM blocked in the mask (a JVM- or
.NET-hosted runner), ``launch ... >&-``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from harness.helpers import LAUNCH, REPO, Output, env_for_tests, launch, pids_with_env, run_pids
from harness.runs import fault

pytestmark = pytest.mark.slow

COMMON = ("--set", "train.num_steps=100000", "--set", "cluster.devices_per_process=1",
          "--set", "logging.log_every_steps=5", "--set", "checkpoint.every_steps=5",
          "--set", "restarts.backoff_s=0.2", "--set", "task.args.sleep_s=0.05",
          "--set", "task.args.slow_process_id=0")


def _term_ignored_and_blocked() -> None:
    """``preexec_fn``: SIGTERM ignored (``trap '' TERM``) and blocked in the mask, SIGHUP at its
    default (as ``harness.helpers.sighup_default``)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _signal_set(pid: int, field: str) -> int:
    """``/proc/PID/status``'s ``field`` (SigBlk, SigIgn) as a bit mask (bit n-1: signal n)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_a_runner_that_ignores_and_blocks_sigterm_passes_neither_on(tmp_path):
    """Started with SIGTERM ignored and blocked, the workers inherited both: a preemption's
    SIGTERM to a worker was never delivered, and ``launch stop`` exited 0 while the run
    trained on. Now the worker's SIGTERM is a notice (every process stops after one agreed
    step, a preemption restart) and ``launch stop`` stops the run."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        LAUNCH + ["jobs/linear.yaml", *COMMON, *fault("sigterm", 7), "--run-dir", str(run_dir)],
        cwd=REPO, env=env_for_tests(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL, preexec_fn=_term_ignored_and_blocked)
    out = Output.of(proc)
    try:
        out.wait_for(r"after a notice from process 1: every process stops after step \d+.* "
                     r"\[preemption\]; restarting", 120)
        out.wait_for(r"^\[p0\] resumed from the checkpoint of step \d+ \(attempt 1\)", 120)
        term = 1 << (signal.SIGTERM - 1)
        for pid in [proc.pid, *run_pids(str(run_dir))]:  # the launcher and every worker
            assert not _signal_set(pid, "SigBlk") & term and not _signal_set(pid, "SigIgn") & term
        stopped = launch("stop", str(run_dir), timeout_s=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        code, text = out.finish(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert code == 130, text[-3000:]
    assert not run_pids(str(run_dir)), text[-3000:]


def _shell(command: str, **env) -> subprocess.CompletedProcess:
    """``command`` run by bash in the repository, stderr captured, stdout as the command leaves it."""
    return subprocess.run(["bash", "-c", command], cwd=REPO, env=env_for_tests(**env),
                          stderr=subprocess.PIPE, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_a_closed_stdout_changes_no_outcome_attached_or_detached(tmp_path):
    """``launch ... >&-``: a run that succeeded exited 1, and a detached supervisor died at
    once (the first pipe it opened took descriptor 1) while its workers ran on alone."""
    launch_cmd = " ".join(LAUNCH)
    run_dir = tmp_path / "run"
    done = _shell(f"{launch_cmd} jobs/linear.yaml --set train.num_steps=20 "
                  f"--set cluster.devices_per_process=1 --run-dir {run_dir} >&-")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK: 2 processes succeeded" in (run_dir / "launcher.log").read_text()
    # stdout and stderr closed, detached: the supervisor runs the job to its end
    detached = tmp_path / "detached"
    started = _shell(f"{launch_cmd} jobs/linear.yaml --set train.num_steps=20 "
                     f"--set cluster.devices_per_process=1 --run-dir {detached} --detach >&- 2>&-")
    assert started.returncode == 0
    waited = launch("wait", str(detached), timeout_s=300)
    assert waited.returncode == 0, (detached / "launcher.log").read_text()[-3000:]
    assert "OK: 2 processes succeeded" in (detached / "launcher.log").read_text()
    deadline = time.monotonic() + 30
    while pids_with_env("PODLAUNCH_RUN_DIR", str(detached)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not run_pids(str(detached))
    assert re.search(r"^\S+ podlaunch: ", (detached / "launcher.log").read_text(), re.M)
    # its reader gone at once (`| head -c 1`): the run started, so the command exits 0
    cut = tmp_path / "cut"
    started = _shell(f"{launch_cmd} jobs/linear.yaml --set train.num_steps=20 "
                     f"--set cluster.devices_per_process=1 --run-dir {cut} --detach "
                     "| head -c 1 >/dev/null; exit ${PIPESTATUS[0]}")
    assert started.returncode == 0, started.stderr[-3000:]
    assert launch("wait", str(cut), timeout_s=300).returncode == 0


def _open_files(soft: int, hard: int):
    def limit() -> None:
        import resource

        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return limit


@pytest.mark.parametrize("soft, hard", [(20, 4096), (20, 20)])
def test_a_low_open_files_limit_is_raised_to_the_hard_one_or_named_as_the_cause(tmp_path, soft,
                                                                                  hard):
    """Issue 71: at a low open-files limit 2 of 8 logs were missing and the verdict blamed
    the network ("could not join the coordinator ... a configuration or network problem").
    The launcher raises the soft limit to the hard one for itself and every worker; a hard
    limit too low is named as the cause."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        LAUNCH + ["jobs/linear.yaml", "--set", "cluster.num_processes=8",
                  "--set", "cluster.devices_per_process=1", "--set", "train.num_steps=10",
                  "--set", "restarts.max_restarts=0", "--run-dir", str(run_dir)],
        cwd=REPO, env=env_for_tests(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL, preexec_fn=_open_files(soft, hard))
    code, text = Output.of(proc).finish(240)
    if hard > soft:
        assert code == 0, text[-3000:]
        assert len(os.listdir(run_dir / "logs")) == 8
        return
    assert code == 1, text[-3000:]
    # where it bites first: a worker (gloo's sockets), or the launcher starting one
    assert re.search(r"attempt 0 failed: process_id \d on localhost .*a limit of its host that ran "
                     r"out, which a restart finds run out again: too many open files .*\[final\]",
                     text) or re.search(r"cannot start process_id \d: .*too many open files: this "
                                        r"process's limit is 20 \(hard limit 20\)", text), text[-3000:]
    assert "network problem" not in text, text[-3000:]
