"""Shared test helpers: run the real `launch` CLI, inspect the process table, read events."""

from __future__ import annotations

import contextlib
import glob
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = [sys.executable, "-m", "launcher.cli"]
# the test programs (user tasks such as faulty_task:make, program jobs): on the workers' PYTHONPATH
PROGRAMS = os.path.join(REPO, "tests", "programs")


# A program job running tests/programs/faulty_program.py (its modes are its docstring's).
PROGRAM_JOB = """\
name: faulty
program:
  argv: [python, faulty_program.py, {mode}, "{target}", "{at}"]
  num_steps: {steps}
  env: {{STEPS: "{steps}"}}
logging: {{log_every_steps: {log_every}}}
watchdog: {{stall_timeout_s: 30}}
cluster: {{backend: local, num_processes: {num_processes}, devices_per_process: 1, grace_s: 2}}
"""


def program_job(tmp_path, mode: str = "none", target: int = 1, at: int = 5, steps: int = 20,
                log_every: int = 5, num_processes: int = 3) -> str:
    """Write a program job of tests/programs/faulty_program.py into ``tmp_path``; returns its path.

    Fault tests of the built-in trainer take it in place of ``jobs/linear.yaml`` to check
    that a program job gets the same lifecycle (``--set`` changes it further).
    """
    os.makedirs(str(tmp_path), exist_ok=True)
    path = os.path.join(str(tmp_path), "faulty.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(PROGRAM_JOB.format(mode=mode, target=target, at=at, steps=steps,
                                   log_every=log_every, num_processes=num_processes))
    # a copy, not a link: ssh hosts get program.dir by sync, which skips links
    shutil.copyfile(os.path.join(PROGRAMS, "faulty_program.py"),
                    os.path.join(str(tmp_path), "faulty_program.py"))
    return path


# For a test of how a failure is met (teardown, naming the cause), not of the restart after it:
# the first failure ends the run, whatever its class's budget (restarts retry infrastructure
# faults, preemptions and stalls by default)
NO_RESTARTS = ("--set", "restarts.max_restarts=0")

# A trainer run that lasts until the test stops it need not take the cores while it waits:
# process 0 sleeps 50 ms after each step (tests/programs/faulty_task.py's straggler) and the
# others wait for it in the step's all-reduce. Three processes, from 10 s to 30 s after the
# start: 4.3 CPU-s instead of about 30 at full speed (about 210 steps a second), which the
# CI machine's two cores paid in every such test.
PACED = ("--set", "task.name=faulty_task:make", "--set", "task.args.sleep_s=0.05",
         "--set", "task.args.slow_process_id=0")

# The two kinds of job a fault test runs: the built-in trainer and a program job.
KINDS = ("trainer", "program")


def long_job(kind: str, tmp_path, log_every: int = 20, mode: str = "none", target: int = 1,
             at: int = 5) -> tuple:
    """``launch`` arguments of a 2-process job (1 CPU device each) that runs until stopped:
    ``jobs/linear.yaml`` for the trainer (``PACED``), tests/programs/faulty_program.py (``mode``, ``target``,
    ``at``: its fault) for a program. Trainer faults are the test's own ``--set task...``."""
    if kind == "trainer":
        return ("jobs/linear.yaml", "--set", "train.num_steps=1000000",
                "--set", f"logging.log_every_steps={log_every}",
                "--set", "cluster.devices_per_process=1", *PACED)
    return (program_job(tmp_path, mode, target, at, steps=1000000, log_every=log_every,
                        num_processes=2),)


# JAX's persistent compilation cache shared by the session's launches (one directory per
# pytest-xdist worker, so no two workers write one entry at once; tests/conftest.py sets it):
# a worker honours JAX_COMPILATION_CACHE_DIR (worker/runtime/compilecache.py), and process 0 of a
# launch loads what an earlier launch of the same step compiled instead of compiling again.
# A test of the job's own cache (where it lies, what it counted) takes the
# ``own_compilation_cache`` fixture (tests/conftest.py), or empties the variable in its
# cluster's env where the hosts' sessions set it.
SHARED_COMPILATION_CACHE: str | None = None


def env_for_tests(**extra) -> dict:
    """This environment plus tests/programs on PYTHONPATH (for test tasks), minus JAX and CUDA
    device vars, plus the session's ``SHARED_COMPILATION_CACHE``; ``extra`` is added last (a value of
    None removes the variable)."""
    # COLUMNS and LINES too: a test's terminal is the pty it makes (pytest-xdist's workers
    # have COLUMNS set, which shutil.get_terminal_size would prefer to the pty's size)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_", "PODLAUNCH_"))
           and k not in ("COLUMNS", "LINES", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PROGRAMS, REPO, env.get("PYTHONPATH")) if p)
    # the venv's own `launch` on PATH, as after `source .venv/bin/activate`: next steps are
    # then written as `launch ...` (tests/console/test_next_steps.py tries them without it)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    if SHARED_COMPILATION_CACHE:
        env["JAX_COMPILATION_CACHE_DIR"] = SHARED_COMPILATION_CACHE
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def launch(*args: str, timeout_s: float = 300, cwd: str | None = None,
           **env) -> subprocess.CompletedProcess:
    """Run ``launch ARGS`` to completion (``env``: variables beside ``env_for_tests``'s);
    returns the CompletedProcess (text)."""
    return subprocess.run(LAUNCH + list(args), cwd=cwd or REPO, env=env_for_tests(**env),
                          capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)


def sighup_default() -> None:
    """``preexec_fn`` of a launcher a test may send SIGHUP: SIGHUP back to its default.

    A test runner started under ``nohup`` (or by a CI agent that ignores SIGHUP) passes an
    ignored SIGHUP on to every child, and the launcher keeps an ignored SIGHUP ignored
    (``nohup launch``: test_lifecycle.test_nohup_keeps_sighup_ignored); a launch from a
    terminal has it at its default.
    """
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start_launch(*args: str, cwd: str | None = None) -> subprocess.Popen:
    """Start ``launch ARGS`` in the background, output piped (merged), SIGHUP at its default."""
    return subprocess.Popen(LAUNCH + list(args), cwd=cwd or REPO, env=env_for_tests(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, preexec_fn=sighup_default)


class Output:
    """A started process's output, read line by line on a thread, so every wait has a deadline.

    A process that goes silent fails the wait at its own deadline, naming what was awaited,
    instead of blocking a ``readline`` until pytest's timeout.
    """

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines = proc, []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    @classmethod
    def of(cls, proc: subprocess.Popen) -> "Output":
        """The one Output reading ``proc`` (made on first use): two readers would split its lines."""
        if getattr(proc, "_output", None) is None:
            proc._output = cls(proc)
        return proc._output

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def _fail(self, message: str):
        import pytest

        pytest.fail(f"{message}; output so far:\n{self.text[-4000:]}", pytrace=False)

    def wait_for(self, pattern: str, timeout_s: float, count: int = 1) -> str:
        """Read until ``count`` lines matched ``pattern`` (re.search); returns the last match's line.

        Fails the test at ``timeout_s`` (from this call), or when the output ends first.
        """
        deadline, seen = time.monotonic() + timeout_s, 0
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._fail(f"no line matching {pattern!r} (x{count}) within {timeout_s:g} s")
            if line is None:
                self._queue.put(None)
                self._fail(f"the output ended before a line matching {pattern!r} (x{count})")
            self.lines.append(line)
            if re.search(pattern, line):
                seen += 1
                if seen >= count:
                    return line

    def finish(self, timeout_s: float) -> tuple[int, str]:
        """Read to the end and wait for the exit: ``(returncode, all output)``; fails at ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._fail(f"the process did not end within {timeout_s:g} s")
            if line is None:
                break
            self.lines.append(line)
        try:
            self.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._fail(f"the process closed its output but did not exit within {timeout_s:g} s")
        return self.proc.returncode, self.text


@contextlib.contextmanager
def launched(*args: str, cwd: str | None = None):
    """``start_launch(ARGS)`` as an ``Output``; the launcher is SIGKILLed if still running at the end."""
    proc = start_launch(*args, cwd=cwd)
    try:
        yield Output.of(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def pids_with_env(name: str, value: str) -> list[int]:
    """Live (non-zombie) pids whose environment has ``name=value``: the process table, read."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ and state != b"Z":
            found.append(int(entry))
    return found


def run_pids(run_dir: str) -> list[int]:
    """Live pids of the workers of the run in ``run_dir``."""
    return pids_with_env("PODLAUNCH_RUN_DIR", os.path.abspath(run_dir))


def most_zombies_while_running(proc: subprocess.Popen, run_dirs: list) -> int:
    """Until ``proc`` ends: the most zombies seen at once whose parent is the wrapper of a
    worker of one of ``run_dirs`` (its run directory as its host sees it). Fails the test
    if no wrapper was ever seen (a watch that looked at nothing)."""
    most, looked = 0, 0
    while proc.poll() is None:
        wrappers = set()
        for pid in (p for d in run_dirs for p in run_pids(d)):
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    wrappers.add(int(f.read().rsplit(b")", 1)[1].split()[1]))
            except OSError:
                pass
        zombies = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == b"Z" and int(fields[1]) in wrappers:
                zombies += 1
        most = max(most, zombies)
        looked += bool(wrappers)
        time.sleep(0.2)
    assert looked, f"no worker of {run_dirs} was ever seen running"
    return most


def wait_gone(run_dir: str, timeout_s: float) -> list[int]:
    """Wait until no worker of ``run_dir`` lives; returns the survivors (empty if none)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = run_pids(run_dir)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def read_scalars(logdir: str) -> dict:
    """Every scalar in every event file under ``logdir``, read with TensorBoard's own reader,
    but those of each process's own run (``tensorboard/process_NNN``: ``read_own_step_times``).

    Returns {tag: [(step, value), ...]} sorted by step.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict = {}
    for path in sorted(glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True)):
        if re.fullmatch(r"process_\d{3}", os.path.basename(os.path.dirname(path))):
            continue
        acc = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {tag: sorted(values) for tag, values in out.items()}

def read_own_step_times(logdir: str) -> dict:
    """{process id: [(step, own step time s), ...]}: the ``own_step_time_s`` scalar of each
    process's own TensorBoard run (``logdir/process_NNN``), read with TensorBoard's reader."""
    out = {}
    for run in sorted(glob.glob(os.path.join(logdir, "process_[0-9][0-9][0-9]"))):
        scalars = read_scalars_of_run(run)
        assert set(scalars) == {"own_step_time_s"}, (run, set(scalars))
        out[int(os.path.basename(run)[len("process_"):])] = scalars["own_step_time_s"]
    return out


def read_scalars_of_run(run: str) -> dict:
    """The scalars of one TensorBoard run (its directory's own event files, not below)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict = {}
    for path in sorted(glob.glob(os.path.join(run, "events.out.tfevents.*"))):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {tag: sorted(values) for tag, values in out.items()}


def custom_scalars_layout(logdir: str):
    """The Custom Scalars plugin's layout in ``logdir``'s event files, read with TensorBoard's
    own reader and proto."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2

    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        acc = EventAccumulator(path, size_guidance={"tensors": 0})
        acc.Reload()
        if "custom_scalars__config__" in acc.Tags()["tensors"]:
            proto = acc.Tensors("custom_scalars__config__")[0].tensor_proto
            return layout_pb2.Layout.FromString(proto.string_val[0])
    raise AssertionError(f"no custom scalars layout in {logdir}")


def event_files(run_dir: str) -> list[str]:
    return glob.glob(os.path.join(run_dir, "**", "events.out.tfevents.*"), recursive=True)


@contextlib.contextmanager
def full_disk_ready(path, size: str):
    """A real filesystem of ``size`` (a tmpfs) mounted at ``path`` for the test, unmounted
    after; skips where mounting is not allowed (CI runs as root, where it is)."""
    import pytest

    os.makedirs(str(path), exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()} (CI runs as root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path) -> None:
    """Write ``path`` until its filesystem is full (the write that fails is not an error)."""
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)


def checked_ledger(run_dir) -> dict:
    """``<run_dir>/ledger.json`` (``launcher.rundir.ledger``), checked as every test of a real
    run checks it: every bucket present and >= 0, each attempt's buckets adding up to its
    ``wall_s``, and the run's to its wall time (run.json's ``duration_s``) within 1%.

    Returns the ledger ({"run": ..., "attempts": [...]}).
    """
    import json

    from launcher.rundir import ledger

    with open(os.path.join(run_dir, ledger.LEDGER_FILE)) as f:
        data = json.load(f)
    with open(os.path.join(run_dir, "run.json")) as f:
        record = json.load(f)
    for entry in data["attempts"] + [data["run"]]:
        buckets = entry["buckets_s"]
        assert set(buckets) == set(ledger.BUCKETS), entry
        assert all(v >= 0 for v in buckets.values()), entry
        assert abs(sum(buckets.values()) - entry["wall_s"]) <= 0.01, entry
    wall = data["run"]["wall_s"]
    assert abs(wall - record["duration_s"]) <= 0.01 * record["duration_s"], (data["run"], record)
    assert record["goodput"] == data["run"]["goodput"]
    return data


def logged_steps(log_path) -> int | None:
    """The furthest step a process's log shows (its progress lines and its own failure line)."""
    from launcher import logtimes

    steps = [int(m.group(1) or m.group(2)) for m in
             re.finditer(r"^(?:step (\d+)/\d+ |failed at step (\d+):)", logtimes.read_text(log_path), re.M)]
    return max(steps, default=None)


def read_text(logdir: str, tag: str) -> str:
    """Process 0's text of ``tag`` (TensorBoard's text tab), read with TensorBoard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (path,) = [p for p in glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
               if not p.endswith(".goodput")]
    acc = EventAccumulator(path, size_guidance={"tensors": 0})
    acc.Reload()
    return acc.Tensors(f"{tag}/text_summary")[0].tensor_proto.string_val[0].decode()


def read_plugin_data(logdir: str):
    """(text of the 'spec' tag, hparams session_start_info, hparams experiment) via TensorBoard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    # one file of the job's, process 0's: a second writer would have a file of its own (named
    # by process); the launcher's goodput ledger is its own file in the run, "*.goodput"
    (path,) = [p for p in glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
               if not p.endswith(".goodput")]
    assert path.endswith(".process-000"), path
    acc = EventAccumulator(path, size_guidance={"tensors": 0})
    acc.Reload()
    text = acc.Tensors("spec/text_summary")[0].tensor_proto.string_val[0].decode()
    hparams = {tag: plugin_data_pb2.HParamsPluginData.FromString(content)
               for tag, content in acc.PluginTagToContent("hparams").items()}
    return (text, hparams["_hparams_/session_start_info"].session_start_info,
            hparams["_hparams_/experiment"].experiment)
