"""Where users really run, on this machine: a closed terminal, a closed pipe, early exits,
helper processes, init failures. Real launcher, real workers; the process table is
checked after each fault (``helpers.run_pids``: every live process of the run).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import termios
import threading
import time

import pytest

from harness.helpers import (KINDS, LAUNCH, PACED, REPO, env_for_tests, long_job, most_zombies_while_running,
                     run_pids, sighup_default, start_launch, wait_gone)

pytestmark = pytest.mark.slow  # every test here starts the launcher and real workers

LONG = ("--set", "train.num_steps=1000000", "--set", "logging.log_every_steps=20",
        "--set", "cluster.devices_per_process=1", *PACED)


def _controlling_tty():
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # after setsid: the pty becomes the session's terminal
    sighup_default()


class _Terminal:
    """The pty master read on a thread, as a terminal reads it: the launcher's writes never
    wait on the test (a test that stops reading while it runs ``launch stacks`` filled the
    pty's buffer, and a launcher blocked in a write answered nothing)."""

    def __init__(self, fd: int):
        self.fd, self.seen, self.ended = fd, b"", False
        self._lock = threading.Lock()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: the slave side is closed, or the test closed the master
                chunk = b""
            with self._lock:
                if not chunk:
                    self.ended = True
                    return
                self.seen += chunk

    def text(self) -> str:
        with self._lock:
            return self.seen.decode(errors="replace")

    def wait_for(self, pattern: str, timeout_s: float = 120, since: int = 0) -> str:
        """Everything read so far once ``pattern`` is found past character ``since``."""
        deadline = time.monotonic() + timeout_s
        while not re.search(pattern, self.text()[since:]):
            assert time.monotonic() < deadline and not self.ended, self.text()[-4000:]
            time.sleep(0.05)
        return self.text()

    def wait_for_step(self, at_least: int, timeout_s: float = 120, since: int = 0) -> str:
        """Everything read so far once process 0 shows a step line of ``at_least`` or later
        past character ``since``: on a terminal step lines come at a person's pace (one in
        2 s a process, launcher.console.pace), not every log step."""
        deadline = time.monotonic() + timeout_s
        while max(map(int, re.findall(r"\[p0\] step (\d+)/", self.text()[since:])),
                  default=-1) < at_least:
            assert time.monotonic() < deadline and not self.ended, self.text()[-4000:]
            time.sleep(0.05)
        return self.text()


@pytest.mark.parametrize("kind", KINDS)
def test_the_terminal_closing_is_sighup_and_stops_everything_like_sigterm(tmp_path, kind):
    """Kind 3: the launcher runs on a pty as its session's controlling terminal; closing the
    pty's master is what a closed terminal window does (the kernel sends SIGHUP; later writes
    fail with EIO)."""
    run_dir = tmp_path / "run"
    master, slave = os.openpty()
    proc = subprocess.Popen(LAUNCH + [*long_job(kind, tmp_path), "--show", "all", "--run-dir", str(run_dir)],
                            cwd=REPO, env=env_for_tests(), stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, preexec_fn=_controlling_tty)
    os.close(slave)
    terminal = _Terminal(master)
    try:
        shown = terminal.wait_for_step(60)
        assert len(run_pids(str(run_dir))) == 2
        # launch stacks on the live run: every process's stacks, and the run goes on
        asked = subprocess.run(LAUNCH + ["stacks", str(run_dir)], cwd=REPO, env=env_for_tests(),
                               capture_output=True, text=True, timeout=60)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        for process_id in (0, 1):
            assert re.search(rf"^stacks: p{process_id} stands in \S+", asked.stdout, re.M), asked.stdout
            path = run_dir / "logs" / f"process-00{process_id}.stacks.txt"
            assert f"process {process_id}: {path}" in asked.stdout
            assert "(most recent call first):" in path.read_text()
        if kind == "program":  # its own loop, in tests/programs/faulty_program.py
            assert re.search(r"^stacks: p0 stands in \S+ \(faulty_program\.py:\d+\)", asked.stdout,
                             re.M), asked.stdout
        seen = terminal.wait_for(r"stacks \(asked by launch stacks\): read 2 of 2 processes")
        step = max(int(s) for s in re.findall(r"\[p0\] step (\d+)/", seen))
        terminal.wait_for_step(step + 20, since=len(seen))  # still training
        assert len(run_pids(str(run_dir))) == 2
    finally:
        os.close(master)  # the terminal goes away
    try:
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert not wait_gone(str(run_dir), 5.0)
    log = (run_dir / "launcher.log").read_text()
    assert "interrupted (SIGHUP); stopping all processes" in log, log
    assert "INTERRUPTED: every process was stopped." in log, log
    # the workers were stopped in order (SIGTERM), so process 0 wrote every step it logged
    last_shown = max(int(s) for s in re.findall(r"\[p0\] step (\d+)/", shown))
    metrics = (run_dir / "tensorboard" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(metrics[-1])["step"] >= last_shown


def test_nohup_keeps_sighup_ignored(tmp_path):
    """``nohup launch ...``: SIGHUP was set to be ignored, and stays so."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(["nohup"] + LAUNCH + ["jobs/linear.yaml", "--show", "all", "--run-dir", str(run_dir),
                                                  *LONG],
                            cwd=REPO, env=env_for_tests(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        for line in proc.stdout:
            if re.match(r"\[p1\] step \d+/", line):
                break
        proc.send_signal(1)  # SIGHUP
        time.sleep(1.0)
        assert proc.poll() is None and len(run_pids(str(run_dir))) == 2
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, out
    assert not wait_gone(str(run_dir), 5.0)


def test_a_closed_stdout_never_ends_supervision(tmp_path):
    """Kind 4: ``launch job.yaml | head -5``: no traceback, the run goes on to its end,
    the summary lands in the run directory's launcher.log, nothing is left running."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(LAUNCH + ["jobs/linear.yaml", "--show", "all", "--run-dir", str(run_dir),
                                      "--set", "train.num_steps=40",
                                      "--set", "logging.log_every_steps=1"],
                            cwd=REPO, env=env_for_tests(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        for _ in range(5):
            proc.stdout.readline()
        proc.stdout.close()  # what head does after its 5 lines
        err = proc.stderr.read().decode()
        proc.wait(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err
    log = (run_dir / "launcher.log").read_text()
    assert "the console went away (BrokenPipeError" in log, log
    assert "OK: 2 processes succeeded" in log, log
    assert not run_pids(str(run_dir))


def test_an_early_exit_0_while_peers_run_is_the_first_failure(tmp_path):
    """Kind 6: process 1 exits 0 at step 5 of 100000; its peers would wait ~30 s for JAX's
    heartbeat and die of SIGABRT. It is named first, at once, and not retried."""
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = subprocess.run(
        LAUNCH + ["jobs/linear.yaml", "--show", "all", "--run-dir", str(run_dir), "--set", "cluster.num_processes=4",
                  "--set", "cluster.devices_per_process=1", "--set", "train.num_steps=100000",
                  "--set", "logging.log_every_steps=1", "--set", "task.name=faulty_task:make",
                  "--set", "task.args.crash_at_step=5", "--set", "task.args.crash_process_id=1",
                  "--set", "task.args.mode=exit0", "--set", "restarts.max_restarts=2"],
        cwd=REPO, env=env_for_tests(), capture_output=True, text=True, timeout=180,
        stdin=subprocess.DEVNULL)
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"^FAILED: process_id 1 on localhost \(exit code 0 before its last step "
                     r"\(last logged step 5 of 100000; it never said done\)\)", result.stdout,
                     re.M), result.stdout
    assert "which a restart would repeat" in result.stdout
    assert "attempt 1" not in result.stdout  # not retried
    assert time.monotonic() - started < 60  # not JAX's heartbeat timeout per attempt
    assert not run_pids(str(run_dir))


def _launch_env(**extra) -> dict:
    return env_for_tests(**extra)


def test_a_proxy_in_the_environment_does_not_carry_coordinator_traffic(tmp_path):
    """Kind 7: http_proxy/https_proxy set in the launching shell (a proxy nobody runs)."""
    run_dir = tmp_path / "run"
    proxy = "http://127.0.0.1:9"  # the discard port: nothing listens
    result = subprocess.run(
        LAUNCH + ["jobs/linear.yaml", "--show", "all", "--run-dir", str(run_dir), "--set", "train.num_steps=5",
                  "--set", "distributed.initialization_timeout_s=20"],
        cwd=REPO, env=_launch_env(http_proxy=proxy, https_proxy=proxy, HTTPS_PROXY=proxy,
                                  grpc_proxy=proxy, no_proxy="example.com"),
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "OK: 2 processes succeeded" in result.stdout
    assert not run_pids(str(run_dir))


@pytest.mark.parametrize("kind", KINDS)
def test_a_process_that_cannot_join_is_an_init_failure_not_a_preemption(tmp_path, kind):
    """Kind 7: process 0 (the coordinator) never comes up (the trainer: a sitecustomize
    sleeps; a program: it never calls initialize); process 1 times out joining (JAX aborts
    it: SIGABRT). Not retried; the summary names process 0 as the one that never began
    joining, and the message says what to check."""
    env = _launch_env()
    if kind == "trainer":
        site = tmp_path / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(
            "import os, time\nif os.environ.get('PODLAUNCH_PROCESS_ID') == '0':\n    time.sleep(120)\n")
        env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
        job = ("jobs/linear.yaml", "--set", "train.num_steps=5")
    else:
        job = long_job(kind, tmp_path, mode="never-join", target=0)
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = subprocess.run(
        LAUNCH + [*job, "--show", "all", "--run-dir", str(run_dir),
                  "--set", "distributed.initialization_timeout_s=3", "--set", "restarts.max_restarts=2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    out = result.stdout
    assert result.returncode == 1, out[-3000:] + result.stderr
    # JAX aborts a timed-out join (SIGABRT) since 0.10; 0.9 logs a fatal error and exits 1
    assert re.search(r"^FAILED: process_id 1 on localhost \((killed by SIGABRT|exit code 1)\) while joining the "
                     r"coordinator at 127\.0\.0\.1:\d+; it failed first\.", out, re.M), out[-3000:]
    assert re.search(r"^process_id 0 on localhost never began joining the coordinator \(no 'joining "
                     r"the coordinator' line\); the processes that did waited for it for "
                     r"distributed\.initialization_timeout_s 3 s$", out, re.M), out[-3000:]
    # the late process is named with the setting, not the network (issue 51.2)
    assert re.search(r"attempt 0 failed: process_id 0 on localhost never began joining, and "
                     r"process_id 1 on localhost gave up waiting for it to join .* after "
                     r"distributed\.initialization_timeout_s 3 s: a late start", out), out[-3000:]
    assert "firewalls" not in out
    assert "attempt 1" not in out and "preemption" not in out
    assert time.monotonic() - started < 60  # the 3 s initialization timeout, not the 120 s sleep
    assert not wait_gone(str(run_dir), 5.0)


def _helpers(run_dir) -> list:
    """The run's live ``sleep 1234`` helpers (they inherit PODLAUNCH_RUN_DIR)."""
    out = []
    for pid in run_pids(str(run_dir)):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", b"1234"]:
                    out.append(pid)
        except OSError:
            pass
    return out


def _with_helpers(kind, tmp_path, crash_process_id=None, log_every=20) -> tuple:
    """A long job of ``kind`` whose every process starts two ``sleep 1234`` helpers after
    step 1 (faulty_task's or faulty_program's ``helpers``); with ``crash_process_id``,
    that process raises at step 5."""
    if kind == "program":
        mode = "helpers" if crash_process_id is None else "helpers+raise"
        return long_job(kind, tmp_path, log_every, mode, target=crash_process_id or 0, at=5)
    crash = () if crash_process_id is None else (
        "--set", "task.args.crash_at_step=5", "--set", f"task.args.crash_process_id={crash_process_id}")
    return (*long_job(kind, tmp_path, log_every), "--set", "task.name=faulty_task:make",
            "--set", "task.args.helpers=true", *crash)


@pytest.mark.parametrize("kind", KINDS)
def test_helpers_a_worker_started_die_with_it_even_after_the_launcher_is_sigkilled(tmp_path, kind):
    """Kind 5: each worker starts ``sleep 1234`` twice (one left its process group); the
    launcher is SIGKILLed: nothing of the run, helpers included, outlives it."""
    run_dir = tmp_path / "run"
    proc = start_launch(*_with_helpers(kind, tmp_path), "--show", "all", "--run-dir", str(run_dir))
    try:
        seen = 0
        for line in proc.stdout:
            seen += f"faulty_{kind.replace('trainer', 'task')}: started 2 helpers" in line
            if seen == 2:
                break
        deadline = time.monotonic() + 10
        while len(_helpers(run_dir)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_helpers(run_dir)) == 4
        proc.kill()
        proc.wait(10)
    finally:
        proc.kill()
    assert not wait_gone(str(run_dir), 15.0)


@pytest.mark.parametrize("kind", KINDS)
def test_helpers_die_when_a_worker_fails_and_the_run_is_torn_down(tmp_path, kind):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        LAUNCH + [*_with_helpers(kind, tmp_path, crash_process_id=1, log_every=1), "--show", "all",
                  "--run-dir", str(run_dir)],
        cwd=REPO, env=env_for_tests(), capture_output=True, text=True, timeout=180,
        stdin=subprocess.DEVNULL)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    assert result.stdout[result.stdout.index("FAILED:"):].startswith("FAILED: process_id 1 on localhost ("), \
        result.stdout[-3000:]
    started = rf"^\[p\d\] faulty_{kind.replace('trainer', 'task')}: started 2 helpers"
    assert len(re.findall(started, result.stdout, re.M)) == 2
    assert not wait_gone(str(run_dir), 5.0)


@pytest.mark.slow
def test_a_stopped_launcher_is_not_a_stalled_run(tmp_path):
    # Ctrl-Z of the launcher (SIGSTOP here: the same for it) for twice stall_timeout_s, then
    # fg: the workers trained on meanwhile; the watchdog must not SIGKILL them as stalled.
    # Paced (LONG: 20 steps a second) rather than at full speed: the 14 s of stepping cost
    # 14 CPU-s of the CI's two cores at full speed, and the watchdog sees the same heartbeats
    import signal

    from harness.helpers import launched

    run_dir = tmp_path / "run"
    with launched("jobs/linear.yaml", *LONG, "--set", "watchdog.stall_timeout_s=3",
                  "--set", "checkpoint.every_steps=0", "--run-dir", str(run_dir)) as out:
        out.wait_for(r"\[p0\] step 40/", 120)
        out.proc.send_signal(signal.SIGSTOP)
        time.sleep(6.5)
        out.proc.send_signal(signal.SIGCONT)
        out.wait_for(r"the launcher did not run for \d+\.\d s", 30)
        stepped = out.wait_for(r"\[p0\] step \d+/", 30)
        time.sleep(4.0)  # longer than stall_timeout_s again, now with the launcher running
        assert out.proc.poll() is None, out.text[-3000:]
        out.proc.send_signal(signal.SIGINT)
        code, text = out.finish(60)
    assert code == 130, text[-3000:]
    assert "stalled" not in text, text[-3000:]
    assert stepped
    assert not run_pids(str(run_dir))


@pytest.mark.slow
def test_helpers_detached_every_step_leave_no_pile_of_zombies(tmp_path):
    # a program whose helper detaches once per step (loaders, uploaders, os.system("... &")):
    # the orphans are the wrapper's (a subreaper), and it reaps them as the run goes
    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "detach.py").write_text(
        "import os, time\n"
        "for step in range(1000):\n"
        "    os.system(\"sh -c 'sleep 0.02 &'\")\n"
        "print('done', flush=True)\n")
    spec = tmp_path / "detach.yaml"
    spec.write_text(f"name: detach\nprogram: {{argv: [python, detach.py], dir: {prog}}}\n"
                    "cluster: {backend: local, num_processes: 2, devices_per_process: 1}\n")
    run_dir = tmp_path / "run"
    proc = start_launch(str(spec), "--run-dir", str(run_dir))
    most = most_zombies_while_running(proc, [str(run_dir)])
    out = proc.stdout.read()
    assert proc.returncode == 0, out[-3000:]
    # unreaped, they pile up to about 1000 (one per step); reaped as the run goes, a few at once,
    # more while the machine is loaded (up to 16 seen here, on 2 cores busy with other tests)
    assert most <= 100, f"{most} zombies under the wrappers at once"


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_run_that_logs_rarely_lives_on_its_heartbeats(tmp_path, kind):
    # issue 25, item 12: the watchdog's input checked from the side that does not fail:
    # between two log steps (100 steps of 0.03 s; 60 of 0.05 s for the program) no step
    # line comes for longer than stall_timeout_s, so only the heartbeats between them keep
    # the run from being killed as stalled
    from harness.helpers import launch, program_job

    if kind == "trainer":
        args = ("jobs/linear.yaml", "--set", "train.num_steps=200", "--set",
                "cluster.devices_per_process=1", "--set", "task.name=faulty_task:make",
                "--set", "task.args.sleep_s=0.03", "--set", "task.args.slow_process_id=0",
                "--set", "checkpoint.every_steps=0", "--set", "logging.log_every_steps=100")
    else:  # a program's report() beats too
        args = (program_job(tmp_path, steps=120, log_every=60, num_processes=2),)
    done = launch(*args, "--set", "watchdog.stall_timeout_s=2", "--run-dir", str(tmp_path / "run"),
                  timeout_s=180)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "stalled" not in out and "OK: 2 processes succeeded" in out, out[-3000:]
    gaps = [float(g) for g in re.findall(r"step_time_s ([\d.e-]+)", out)]
    steps_between_logs = 100 if kind == "trainer" else 60
    assert gaps and max(gaps) * steps_between_logs > 2, out[-3000:]  # a gap over the timeout
