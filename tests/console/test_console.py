"""The first screen: one view of the job, no library noise, the progress view, past runs.

Fast tests drive the pieces (``launcher.console.lines``, ``Console`` under the real
``supervise`` with fake workers in fake time, ``launcher.rundir.record``, the run names
of ``launch tensorboard``); the slow one reads a real 4-process run's screen
through a pseudo-terminal with a terminal emulator (pyte), as a user sees it.
"""

from __future__ import annotations

import fcntl
import io
import errno
import json
import resource
import os
import re
import struct
import subprocess
import termios
import time
import types

import pytest

from harness.fakes import FakeClock, FakeWorker, process_plan
from harness.helpers import LAUNCH, REPO, env_for_tests, fill, full_disk_ready
from launcher import logtimes
from launcher.console import lines as kinds
from launcher.commands import runs as runs_command, tensorboard as tensorboard_command
from launcher.rundir import record as runs
from launcher.run import logfile
from launcher.run import supervise as supervision
from launcher.console import Console
from launcher.errors import SpecError
from launcher.run.classes import FailureClass, Verdict
from launcher.ends import Exited
from launcher.state import Result, State
from launcher.console.status import status_text
from launcher.words import duration, plural
from worker.contract import causes, wire

GLOO = "[Gloo] Rank {} is connected to 3 peer ranks. Expected number of connected peer ranks is : 3"


def progress(step: int, num_steps: int = 100, loss: float = 0.5, step_time_s: float = 0.1) -> str:
    return wire.PROGRESS_FORMAT.format(step=step, num_steps=num_steps, loss=loss,
                                           steps_per_s=1 / step_time_s, step_time_s=step_time_s,
                                           own_step_time_s=0.01)


# ---- noise, glued lines, notable lines ---------------------------------------------
def test_gloo_lines_are_noise_and_glued_ones_split_back_into_noise_pieces():
    assert kinds.is_noise(GLOO.format(0))
    # two threads wrote at once: one line holds the start of one and all of another ...
    glued = "[Gloo] Rank 1" + GLOO.format(0)
    assert kinds.split_glued(glued) == ["[Gloo] Rank 1", GLOO.format(0)]
    # ... and the next line the rest of the first
    rest = " is connected to 3 peer ranks. Expected number of connected peer ranks is : 3"
    assert all(kinds.is_noise(piece) for piece in kinds.split_glued(glued) + kinds.split_glued(rest))
    # a progress line glued to noise, either side, comes back whole (and still parses)
    for line in (GLOO.format(2) + progress(10), progress(10) + GLOO.format(2), rest + progress(10)):
        pieces = kinds.split_glued(line)
        kept = [p for p in pieces if not kinds.is_noise(p)]
        assert [p.rstrip() for p in kept] == [progress(10)], pieces
        assert wire.parse(kept[0]).step == 10
    assert kinds.split_glued(progress(10)) == [progress(10)]
    assert kinds.split_glued("") == [""]
    # interleaved word by word (seen in a CI run): still noise, every piece of it
    interleaved = ("[Gloo] Rank 1 is connected to 03 is connected to  peer ranks. 3Expected number "
                   "of connected peer ranks is :  peer ranks. 3Expected number of connected peer "
                   "ranks is : 3")
    assert all(kinds.is_noise(piece) for piece in kinds.split_glued(interleaved))
    # words of it in a line of the user's are not noise
    assert not kinds.is_noise("rank 1 is connected to the data service")
    assert not kinds.is_noise("Expected number of rows: 3")


def test_the_line_splitter_searches_each_byte_once_and_holds_a_bounded_part_of_a_line():
    """Linear by count, not by clock: every byte fed is searched exactly once, and of a
    line without a newline at most ``max_held_bytes`` (plus the chunk that crossed it) is
    held; it leaves in ``Piece``s that put back together give every byte, UTF-8 intact."""
    held, chunk = 4096, b"\xc3\xa9" * 1000 + b"x"  # 2001 bytes: each chunk splits an "é" in two
    splitter = kinds.LineSplitter(max_held_bytes=held)
    out, fed = [], 0
    for data in [b"first\r\n"] + [chunk] * 5000 + [b"end\nsecond", b" line\nno newline"]:
        got = splitter.feed(data)
        fed += len(data)
        assert splitter.scanned == fed  # each byte searched once, never rescanned
        assert all(len(p.encode()) < held + len(chunk) for p in got if isinstance(p, kinds.Piece))
        out += got
    out += splitter.end()
    assert splitter.end() == []
    pieces = [p for p in out if isinstance(p, kinds.Piece)]
    assert len(pieces) > 5000 * len(chunk) // (held + len(chunk))
    assert out[0] == "first" and not isinstance(out[0], kinds.Piece)
    long_line = "".join(out[1:len(pieces) + 2])
    assert long_line == chunk.decode() * 5000 + "end"
    assert out[len(pieces) + 2:] == ["second line", "no newline"]


def test_a_long_line_is_shown_shortened_with_its_length():
    shown = kinds.Shortened(max_chars=10)
    assert not shown.pending and shown.end("short") == "short"
    shown.add(kinds.Piece("a" * 8))
    shown.add(kinds.Piece("b" * 8))
    assert shown.pending
    assert shown.end("cc") == "aaaaaaaabb [... line cut: 18 characters in all, every one in the log file]"
    assert not shown.pending and shown.end("x" * 11).startswith("xxxxxxxxxx [... line cut: 11 ")


def test_noise_is_only_what_users_cannot_act_on():
    assert kinds.is_noise("WARNING: All log messages before absl::InitializeLog() is called are "
                          "written to STDERR")
    assert kinds.is_noise("I0000 00:00:1712345678.901234   12345 service.cc:145] XLA service "
                          "0x55d5 initialized for platform Host")
    # XLA:CPU refusing a cache entry another CPU made (issue 71: some 30 of these on a console)
    assert kinds.is_noise("E1201 10:00:00.123456   12345 cpu_aot_loader.cc:210] Loading XLA:CPU AOT "
                          "result. Target machine feature +prefer-no-scatter is not supported on "
                          "the host machine")
    for line in (progress(10), "E0000 00:00:1712345678.901234   12345 gloo.cc:9] connection reset",
                 "W0000 00:00:1712345678.901234   12345 pjrt.cc:9] slow", "[Gloo] step 3/4 in text",
                 "process 1/4 joined 127.0.0.1:1234", "done"):
        assert not kinds.is_noise(line), line


def test_warnings_errors_and_whole_tracebacks_are_notable_routine_lines_are_not():
    attention = kinds.Attention()
    routine = [progress(10), "process 1/4 joined 127.0.0.1:1234", "done",
               "resumed from the checkpoint of step 15 (attempt 1) in 0.021 s",
               "checkpoint of step 20 saved in 0.004 s: /r/checkpoints/step-0000020"]
    assert not any(attention(line) for line in routine)
    traceback = ["Traceback (most recent call last):", '  File "/w/main.py", line 3, in <module>',
                 "    train()", "RuntimeError: injected failure at step 7"]
    assert all(attention(line) for line in traceback)
    assert not attention("step 8/100 after")  # the traceback ended with its exception line
    for line in ("warning: loss is nan at step 17; continuing", "failed at step 7: RuntimeError: x",
                 "worker: JAX disagrees with the launcher's plan", progress(10, loss=float("nan")),
                 "E0000 00:00:1712345678.901234   12345 gloo.cc:9] connection reset",
                 "UserWarning: something", "Fatal Python error: Segmentation fault"):
        assert attention(line), line


# ---- one view under the real supervise --------------------------------------------
class Run:
    def __init__(self, tmp_path, show=frozenset({0}), others=True):
        self.clock = FakeClock()
        self.out = io.StringIO()
        self.console = Console(self.out, show=show, others=others, tty=False, status_every_s=0,
                               clock=self.clock)
        self.log_dir = str(tmp_path)
        self.workers = []

    def worker(self, **script):
        w = FakeWorker(self.clock, process_plan(len(self.workers), self.log_dir), **script)
        self.workers.append(w)
        return w

    def supervise(self):
        result = supervision.supervise(self.workers, 3.0, self.console, poll_interval_s=0.05,
                                       clock=self.clock, sleep=self.clock.sleep)
        self.console.attempt_over(result)
        return result

    def log(self, process_id: int) -> list:
        """Process ``process_id``'s log lines, each without its time."""
        return logtimes.read_text(os.path.join(self.log_dir, f"process-{process_id:03d}.log")).splitlines()


def test_the_default_view_shows_each_step_once_no_noise_and_every_process_s_warnings(tmp_path):
    run = Run(tmp_path)
    for i in range(3):
        run.worker(lines=[(0.1, f"process {i}/3 joined"), (0.2, "[Gloo] Rank 1" + GLOO.format(i)),
                          (0.21, " is connected to 3 peer ranks. Expected number of connected peer "
                                 "ranks is : 3"),
                          (0.3, progress(10)), (0.4, progress(20))]
                   + ([(0.45, "warning: 3 batches of step times were overwritten")] if i == 2 else [])
                   + [(0.5, "done")], exit=Exited(0), exit_at=0.6)
    result = run.supervise()
    assert result.exit_code == 0
    assert run.out.getvalue().splitlines() == [
        "[p0] process 0/3 joined", f"[p0] {progress(10)}", f"[p0] {progress(20)}",
        "[p2] warning: 3 batches of step times were overwritten", "[p0] done"]
    # every line, noise included (split back), is in the logs; the glued one no longer glued
    assert run.log(1) == ["process 1/3 joined", "[Gloo] Rank 1", GLOO.format(1),
                          " is connected to 3 peer ranks. Expected number of connected peer ranks is : 3",
                          progress(10), progress(20), "done"]
    assert [t.last_step for t in result.processes] == [20, 20, 20]


JAX_RETELLS = [  # what JAX 0.9's coordination client prints in every other process when one ends
    "W1206 05:10:06.045743     643 preemption_sync_manager.cc:149] Failed to retrieve preemption "
    "notice from coordination service: UNAVAILABLE: Socket closed",
    "Additional GRPC error information from remote target coordination_service while calling "
    "/tensorflow.CoordinationService/GetKeyValue:",
    ':UNKNOWN:Error received from peer  {grpc_message:"Socket closed", grpc_status:14}. This is '
    "only expected if one of the tasks is unhealthy.",
    "E1206 05:10:06.045816     643 coordination_service_agent.cc:286] Polled an error from "
    "coordination service (this can be an error from this or another task).",
    "F1206 05:10:06.045821     643 client.h:80] Terminating process because the JAX distributed "
    "service detected fatal errors. This most likely indicates that another task died"]


def test_jax_retelling_another_process_s_failure_is_left_in_the_log(tmp_path):
    # issue 50.5: bad data in p0 printed its one sentence, then p1's 9 lines of JAX's
    # coordination client saying p0 went away; those stay in p1's log (and in the view of a
    # process --show names), while p1's own warnings still show
    assert all(kinds.is_consequence_chatter(line) for line in JAX_RETELLS)
    assert not kinds.is_consequence_chatter("E1206 05:10:06.045816   643 gpu.cc:1] out of memory")
    assert not kinds.is_consequence_chatter("warning: the coordination service is slow")
    run = Run(tmp_path)
    run.worker(lines=[(0.1, "worker: data error: /d.npy: row 37 (0-based), column 3: nan is not a "
                            "finite number; data must be finite (fix or drop the row) [data]")],
               exit=Exited(5), exit_at=0.2)
    run.worker(lines=[(0.05, "warning: p1's own warning")]
               + [(0.21 + i / 100, line) for i, line in enumerate(JAX_RETELLS)],
               exit=Exited(1), exit_at=0.4)
    run.supervise()
    shown = run.out.getvalue()
    assert "[p1] warning: p1's own warning" in shown
    assert not any(line[:40] in shown for line in JAX_RETELLS), shown
    assert run.log(1)[1:] == JAX_RETELLS  # every line still in the log
    (tmp_path / "all").mkdir()
    everything = Run(tmp_path / "all", show=None)
    everything.worker(lines=[(0.21, line) for line in JAX_RETELLS], exit=Exited(1), exit_at=0.4)
    everything.supervise()
    assert JAX_RETELLS[0] in everything.out.getvalue()


def test_a_hidden_process_that_fails_shows_its_traceback_and_the_others_their_last_lines(tmp_path):
    run = Run(tmp_path)
    run.worker(lines=[(0.1, progress(10))], on_term="exit")
    run.worker(lines=[(0.1, progress(10)), (0.3, "faulty_task: injecting raise at step 12"),
                      (0.31, "Traceback (most recent call last):"), (0.32, '  File "t.py", line 1'),
                      (0.33, "RuntimeError: boom")], exit=Exited(1), exit_at=0.4)
    run.worker(lines=[(0.1, progress(10)), (0.38, "gloo: peer closed"), (0.39, "bye now")],
               exit=Exited(1), exit_at=0.45)  # a cascade: fails too, by itself
    result = run.supervise()
    assert result.first_failure is result.processes[1]
    shown = run.out.getvalue().splitlines()
    assert shown[:4] == [f"[p0] {progress(10)}", "[p1] Traceback (most recent call last):",
                         '[p1]   File "t.py", line 1', "[p1] RuntimeError: boom"]
    # p1 failed first: the summary shows its tail (not repeated here); p2 failed too: its
    # last lines not shown so far, after the attempt
    assert shown[-4:] == [
        f"podlaunch: p2 failed too (exit code 1); its last 3 lines not shown above "
        f"(all in {run.log_dir}/process-002.log):",
        f"[p2] {progress(10)}", "[p2] gloo: peer closed", "[p2] bye now"]
    assert "injecting" not in run.out.getvalue()
    assert [t.state for t in result.processes] == [State.STOPPED, State.FAILED, State.FAILED]


def test_show_all_and_show_none(tmp_path):
    for show, others, want in [(None, True, ["[p0] a", "[p1] b", "[p1] error: c", "[p1] done",
                                             "[p0] done"]),
                               (frozenset(), False, [])]:
        run = Run(tmp_path / str(show), show=show, others=others)
        os.makedirs(run.log_dir)
        # a worker that succeeds says "done" (an exit 0 without it is an early exit)
        run.worker(lines=[(0.1, "a"), (0.15, GLOO.format(0)), (0.22, "done")], exit=Exited(0),
                   exit_at=0.3)
        run.worker(lines=[(0.12, "b"), (0.2, "error: c"), (0.23, "done")], exit=Exited(0),
                   exit_at=0.3)
        run.supervise()
        assert sorted(run.out.getvalue().splitlines()) == sorted(want)  # across processes: any order


# ---- the progress view ----------------------------------------------------------------
def _tracked(lines, last_at, state=State.RUNNING):
    stats = __import__("launcher.state", fromlist=["ProcessStats"]).ProcessStats()
    for line in lines:
        stats.observe(line)
    plan = process_plan(0, "/tmp")
    return types.SimpleNamespace(plan=plan, stats=stats, state=state,
                                 last_step=wire.parse(lines[-1]).step, progress_at=last_at)


def test_the_eta_counts_down_between_progress_lines_and_the_line_has_elapsed_and_loss():
    t = _tracked([progress(10, 1000, loss=0.25, step_time_s=0.2), progress(20, 1000, 0.125, 0.2)],
                 last_at=100.0)
    etas = []
    for now in (100.0, 101.5, 103.0):
        text = status_text([t], now=now, elapsed_s=now - 40)
        etas.append(float(re.search(r"ETA (\d+)m(\d+)s", text).group(1)) * 60
                    + float(re.search(r"ETA (\d+)m(\d+)s", text).group(2)))
        assert f"elapsed 1m{int(now - 100):02d}s" in text and "loss 0.125" in text
    assert etas == [196.0, 194.0, 193.0]  # 980 steps x 0.2 s, less the time since the last line
    done = _tracked([progress(100, 100)], last_at=100.0)
    assert "ETA" not in status_text([done], now=101.0)  # no ETA once the last step is logged


def test_plural_and_duration():
    assert plural(1, "process") == "1 process" and plural(2, "process") == "2 processes"
    assert plural(0, "restart") == "0 restarts" and plural(1, "CPU device") == "1 CPU device"
    assert [duration(s) for s in (0.04, 9.96, 42.7, 185, 7620)] == ["0.0s", "10.0s", "42s", "3m05s",
                                                                  "2h07m"]


# ---- past runs -------------------------------------------------------------------------
def _result(steps_and_losses, exit_code_states):
    processes = []
    for (step, loss), state in zip(steps_and_losses, exit_code_states):
        stats = types.SimpleNamespace(progress=wire.parse(progress(step, 50, loss)),
                                      saved_step=None)  # launcher.stats.ProcessStats's fields
        processes.append(types.SimpleNamespace(stats=stats, state=state))
    return Result(processes, None, False, 1.0)


def test_run_json_is_written_at_start_and_end_and_a_resume_adds_to_it(tmp_path):
    run_dir = tmp_path / "runs" / "linear" / "20261130-101500-123"
    run_dir.mkdir(parents=True)
    now = [10.0]
    record = runs.Record(str(run_dir), "linear", 50, clock=lambda: now[0])
    record.start()
    started = json.loads((run_dir / "run.json").read_text())
    assert started["state"] == "running" and started["job"] == "linear" and started["step"] is None
    assert runs.read(str(run_dir)).state == "running"  # this process wrote it and lives
    now[0] = 14.5
    preempted = Verdict(FailureClass.PREEMPTION, 1, "process_id 1 on h1 was killed by SIGTERM")
    crashed = Verdict(FailureClass.PROGRAM, 0, "process_id 0 on h0 exited with code 1")
    attempts = [types.SimpleNamespace(number=0, failure=preempted),
                types.SimpleNamespace(number=1, failure=crashed)]
    record.end("failed", _result([(30, 0.25), (28, 0.25)], [State.FAILED] * 2), attempts)
    ended = json.loads((run_dir / "run.json").read_text())
    assert (ended["state"], ended["attempts"], ended["step"], ended["final_loss"], ended["duration_s"]) \
        == ("failed", 2, 30, 0.25, 4.5)
    assert ended["failures"] == {"preemption": 1, "program error": 1}
    assert ended["last_failure"] == {"attempt": 1, "class": "program error", "process_id": 0,
                                     "why": "process_id 0 on h0 exited with code 1"}
    again = runs.Record(str(run_dir), "linear", 50, clock=lambda: now[0])  # --resume
    again.start()
    now[0] = 20.5
    again.end("succeeded", _result([(50, 0.125)], [State.SUCCEEDED]),
              [types.SimpleNamespace(number=2, failure=None)])
    final = json.loads((run_dir / "run.json").read_text())
    assert (final["started"], final["state"], final["attempts"], final["step"], final["duration_s"]) \
        == (started["started"], "succeeded", 3, 50, 10.5)
    assert final["failures"] == {"preemption": 1, "program error": 1}  # a resume adds to them
    assert runs.read(str(run_dir)).failures == {"preemption": 1, "program error": 1}
    broken = runs.Record(str(run_dir), "linear", 50, clock=lambda: now[0])  # a launch that raised
    broken.start()
    broken.end("failed", made=4)
    assert json.loads((run_dir / "run.json").read_text())["attempts"] == 4


def test_launch_runs_lists_runs_newest_first_and_tells_unfinished_and_old_ones(tmp_path):
    root = tmp_path / "runs"

    def make(job, stamp, **data):
        d = root / job / stamp
        d.mkdir(parents=True)
        (d / "spec.yaml").write_text(f"name: {job}\n")
        if data:
            (d / "run.json").write_text(json.dumps({"job": job, **data}))
        return d

    make("linear", "20261130-101500-123", started="2026-11-30T10:15:00", state="succeeded", attempts=3,
         step=100, num_steps=100, final_loss=0.00886711, duration_s=2.8, goodput=0.8123,
         failures={"preemption": 2, "\x1b[2Jbad": "x"}, devices="1x4 tpu")
    make("linear", "20261201-090000-000", started="2026-12-01T09:00:00", state="running", attempts=0,
         step=None, num_steps=100, final_loss=None, duration_s=0.0,
         launcher={"pid": 999999999, "host": os.uname().nodename})  # its launcher is gone
    old = make("diabetes", "20261129-080000-000")  # before run.json: what its files say
    (old / "tensorboard").mkdir()
    (old / "tensorboard" / "metrics.jsonl").write_text('{"step": 10, "loss": 3.5}\n'
                                                       '{"step": 20, "loss": 2.5}\n')
    result = subprocess.run(LAUNCH + ["runs", "--root", str(root)], cwd=str(tmp_path),
                            env=env_for_tests(COLUMNS="200"), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()
    assert rows[0].split() == ["run", "state", "steps", "loss", "time", "goodput", "attempts",
                               "failures", "devices", "run", "dir"]
    assert re.match(r"^linear/20261201-090000-000 +unfinished +- +- +0\.0s +- +0 +- +- +"
                    r"runs/linear/20261201-090000-000$", rows[1]), rows
    assert re.match(r"^linear/20261130-101500-123 +succeeded +100/100 +0\.008867 +2\.8s +"
                    r"0\.81 +3 +preemption 2 +1x4 tpu +runs/linear/20261130-101500-123$", rows[2]), rows
    assert re.match(r"^diabetes/20261129-080000-000 +- +20 +2\.5 +- +- +- +- +- +"
                    r"runs/diabetes/20261129-080000-000$", rows[3]), rows
    only = subprocess.run(LAUNCH + ["runs", "diabetes", "--root", str(root)], cwd=str(tmp_path),
                          env=env_for_tests(), capture_output=True, text=True, timeout=60)
    assert len(only.stdout.splitlines()) == 2
    with pytest.raises(SpecError) as err:
        runs_command.main(["nosuch", "--root", str(root)])
    assert "jobs with runs: diabetes, linear" in str(err.value.problems[0])


def test_launch_runs_survives_any_run_json_it_finds(tmp_path):
    # issue 25, item 11: hand-edited, damaged, another version's: the table lists every run
    root = tmp_path / "runs"
    bad = {"list": "[]", "strings": json.dumps({"job": 5, "state": "\x1b[2Jrunning", "step": {},
                                                 "attempts": True, "final_loss": "abc",
                                                 "duration_s": "x", "started": ["x"]}),
           "nested": "[" * 100000 + "]" * 100000, "binary": "\udcff\x00garbage",
           "huge": json.dumps({"step": 1e400, "final_loss": 1e999,
                                "duration_s": -1, "attempts": -3}),
           "metrics": json.dumps({"job": "linear", "final_metrics": {
               "accuracy": "high", "\x1b[2Jtop1": 0.5, "": 1.0, "nan": "nan",
               **{f"m{n}": n for n in range(50)}}})}
    for i, (name, text) in enumerate(bad.items()):
        d = root / "linear" / f"20261201-09000{i}-000"
        d.mkdir(parents=True)
        (d / "spec.yaml").write_text("name: linear\n")
        (d / "run.json").write_text(text, errors="surrogateescape")
    (root / "linear" / "20261201-090009-000" / "run.json").mkdir(parents=True)  # not even a file
    (root / "linear" / "20261201-090009-000" / "spec.yaml").write_text("name: linear\n")
    result = subprocess.run(LAUNCH + ["runs", "--root", str(root)], cwd=str(tmp_path),
                            env=env_for_tests(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr, result.stderr
    rows = result.stdout.splitlines()
    assert len(rows) == 1 + len(bad) + 1, rows
    assert "\x1b" not in result.stdout and "\\x1b[2Jrunning" in result.stdout, rows
    assert all(row.startswith("linear/") for row in rows[1:]), rows
    # the job's own metrics (issue 70): only names and numbers read, at most two columns
    assert rows[0].split()[3:6] == ["loss", "\\x1b[2Jtop1", "nan"], rows


def test_run_json_is_still_written_when_the_disk_is_full(tmp_path):
    # issue 25, item 11: the end of a run is recorded in run.json's own blocks when no new
    # file fits (a real full filesystem: a 64 KiB tmpfs, filled up)
    with full_disk_ready(tmp_path / "disk", "64k") as disk:
        run_dir = disk / "run"
        run_dir.mkdir()
        record = runs.Record(str(run_dir), "linear", 50)
        record.start()
        fill(disk / "filler")
        with pytest.raises(OSError):
            (run_dir / "probe").write_text("x" * 5000)  # truly full
        record.end("failed", made=1)
        ended = json.loads((run_dir / "run.json").read_text())
        assert (ended["state"], ended["attempts"]) == ("failed", 1)
        assert runs.read(str(run_dir)).state == "failed"
        # a process's log that cannot grow: said once, and its reader goes on
        said: list = []
        with logfile.LogFile(str(run_dir / "process-000.log"), said.append) as log:
            for i in range(2000):
                log.write(f"line {i} " + "x" * 100 + "\n")
        assert len(said) == 1 and "(No space left on device); this process's further lines " \
            "reach the console only" in said[0], said


def test_a_log_that_cannot_be_opened_is_said_once_and_its_reader_goes_on(tmp_path):
    # the reader's log was opened outside the try that keeps a reader alive: with the
    # open-files limit reached, readers died with tracebacks and processes lost their lines
    (tmp_path / "process-000.log").mkdir()  # what open() refuses, as it refuses at EMFILE
    said: list = []
    with logfile.LogFile(str(tmp_path / "process-000.log"), said.append) as log:
        log.write("step 1/2 loss 0.5\n")
        log.flush_pending()
        assert log.flushed_size() is None
    assert len(said) == 1 and said[0].startswith(f"podlaunch: cannot open {tmp_path / 'process-000.log'} (")
    assert said[0].endswith("this process's further lines reach the console only"), said
    words = causes.exhausted(OSError(errno.EMFILE, "Too many open files"))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert words.startswith(f"too many open files: this process's limit is {soft} (hard limit ")


def test_tensorboard_names_a_job_s_runs_by_start_and_what_differs(tmp_path):
    root = tmp_path / "runs"
    dirs = []
    for stamp, lr in (("20261130-101500-123", 0.1), ("20261130-111500-000", 0.3)):
        d = root / "linear" / stamp
        (d / "tensorboard").mkdir(parents=True)
        (d / "spec.yaml").write_text(f"name: linear\noptimizer:\n  name: sgd\n  learning_rate: {lr}\n")
        dirs.append(str(d))
    run_dirs, logdir, what = tensorboard_command.served_runs(None, str(root))  # the newest run's job
    assert logdir is None and sorted(run_dirs) == sorted(dirs) and what.startswith("job linear, 2 runs")
    assert tensorboard_command.served_runs("linear", str(root))[0] == run_dirs
    links = tmp_path / "links"
    links.mkdir()
    linked = tensorboard_command.link_runs(dirs, str(links))
    assert sorted(linked) == ["2026-11-30 10:15:00 optimizer.learning_rate=0.1",
                              "2026-11-30 11:15:00 optimizer.learning_rate=0.3"]
    for name, run_dir in linked.items():
        assert os.path.realpath(links / name) == os.path.join(run_dir, "tensorboard")
    # a tester's report: with one rehearsal among them, every name said cluster.backend=local
    # and nothing else; each run names what it does not share, training settings first
    for stamp, sets in (("20261130-121500-000", "optimizer:\n  name: sgd\n  learning_rate: 0.1\n"
                                                 "cluster:\n  backend: tpu\n  num_processes: 4\n"),
                        ("20261130-131500-000", "optimizer:\n  name: sgd\n  learning_rate: 1.0e+6\n")):
        d = root / "linear" / stamp
        (d / "tensorboard").mkdir(parents=True)
        (d / "spec.yaml").write_text("name: linear\n" + sets)
        dirs.append(str(d))
    for d in dirs[:2]:  # the first two ran locally (their specs said nothing of it)
        with open(os.path.join(d, "spec.yaml"), "a") as f:
            f.write("cluster:\n  backend: local\n  num_processes: 2\n")
    (root / "linear" / "20261130-141500-000" / "tensorboard").mkdir(parents=True)
    (root / "linear" / "20261130-141500-000" / "spec.yaml").write_text(
        "name: linear\noptimizer:\n  name: sgd\n  learning_rate: 0.1\n"
        "cluster:\n  backend: local\n  num_processes: 2\n")
    dirs.append(str(root / "linear" / "20261130-141500-000"))
    names = tensorboard_command.run_names(dirs)
    assert [names[d] for d in dirs] == [
        "2026-11-30 10:15:00", "2026-11-30 11:15:00 optimizer.learning_rate=0.3",
        "2026-11-30 12:15:00 cluster.backend=tpu cluster.num_processes=4",
        "2026-11-30 13:15:00 optimizer.learning_rate=1000000.0", "2026-11-30 14:15:00"], names
    # a tester's report: a 300-character value made a name too long for a file (a traceback,
    # the temporary directory left behind)
    long = root / "linear" / "20261130-151500-000"
    (long / "tensorboard").mkdir(parents=True)
    (long / "spec.yaml").write_text("name: linear\ndata:\n  path: /" + "x" * 300 + "\n")
    long_name = tensorboard_command.run_names(dirs + [str(long)])[str(long)]
    assert len(long_name.encode()) <= 200 and long_name.startswith("2026-11-30 15:15:00 data.path=|xxx")
    # issue 62: a setting left to its default was named "=None"; a rehearsal by three settings
    for stamp, sets, backend in (("20261130-161500-000", "train:\n  momentum: 0.9\n", "local"),
                                 ("20261130-171500-000", "train:\n  momentum: null\n", "local"),
                                 ("20261130-181500-000", "train:\n  momentum: 0.9\ncluster:\n  "
                                  "backend: tpu\n  tpu_name: pod\n", "tpu-rehearsal")):
        d = root / "other" / stamp
        (d / "tensorboard").mkdir(parents=True)
        (d / "spec.yaml").write_text("name: other\n" + sets)
        (d / "run.json").write_text(json.dumps({"job": "other", "backend": backend, "started":
                                                f"2026-11-30T{stamp[9:11]}:{stamp[11:13]}:00"}))
    others = sorted(str(d) for d in (root / "other").iterdir())
    assert list(tensorboard_command.run_names(others).values()) == [
        "2026-11-30 16:15:00", "2026-11-30 17:15:00 train.momentum=default",
        "2026-11-30 18:15:00 rehearsal"]
    (tmp_path / "links2").mkdir()
    assert list(tensorboard_command.link_runs([str(long)], str(tmp_path / "links2")).values()) == [
        str(long)]
    one = tensorboard_command.served_runs(dirs[0], str(root))
    assert one == ([dirs[0]], None, os.path.join(dirs[0], "tensorboard"))
    assert tensorboard_command.served_runs(str(root), str(root))[1] == str(root)  # any other dir: as is
    with pytest.raises(SpecError):
        tensorboard_command.served_runs("nosuch", str(root))


def test_version_and_help():
    result = subprocess.run(LAUNCH + ["--version"], cwd=REPO, env=env_for_tests(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and re.match(r"^launch \(podlaunch\) \d+\.\d+", result.stdout), result
    result = subprocess.run(LAUNCH + ["--help"], cwd=REPO, env=env_for_tests(),
                            capture_output=True, text=True, timeout=60)
    assert "launch runs [JOB]" in result.stdout and "--version" in result.stdout


# ---- slow: a real run's screen, through a pseudo-terminal -----------------------------
STATUS_RE = re.compile(r"4/4 running \| step (\d+)/60 \| ETA ([\d.]+)s \| elapsed \S+ \| loss \S+ \| "
                       r"[\d.]+ steps/s \| slowest p\d")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_4_process_run_on_a_terminal_shows_each_step_once_no_gloo_and_a_falling_eta(tmp_path):
    import pyte

    screen = pyte.Screen(200, 500)  # tall enough that nothing scrolls away
    stream = pyte.ByteStream(screen)
    run_dir = tmp_path / "run"
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 500, 200, 0, 0))
    proc = subprocess.Popen(
        LAUNCH + ["jobs/linear.yaml", "--run-dir", str(run_dir), "--set", "cluster.num_processes=4",
                  "--set", "cluster.devices_per_process=1", "--set", "train.num_steps=60",
                  "--set", "logging.log_every_steps=5", "--set", "task.name=faulty_task:make",
                  # 6 s of steps: the status line's ETA is redrawn often enough to be seen
                  # falling on 2 cores loaded with other tests' workers (0.05 s: 3 seen once)
                  "--set", "task.args.sleep_s=0.1", "--set", "task.args.slow_process_id=0"],
        cwd=REPO, env=env_for_tests(), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
        close_fds=True)
    os.close(slave)
    raw = bytearray()  # every byte written: each redraw of the status line, however read
    deadline = time.monotonic() + 200
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            stream.feed(data)
            raw += data
        code = proc.wait(timeout=30)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    shown = [line.rstrip() for line in screen.display if line.strip()]
    text = "\n".join(shown)
    assert code == 0, text[-3000:]
    # (step, ETA) of each redraw of the status line, read from the bytes written, not from
    # the screen after each read: on loaded cores one read can hold several redraws, and
    # sampling the screen then saw 3 or none (a fresh-clone CI run beside another)
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", bytes(raw).decode("utf-8", "replace"))
    etas = [(int(m.group(1)), float(m.group(2))) for m in STATUS_RE.finditer(plain)]
    etas = [e for i, e in enumerate(etas) if i == 0 or e != etas[i - 1]]
    # each logged step once, from process 0; no library noise; the status line erased at the end
    assert not re.search(r"^\[p[1-9]", text, re.M), text
    steps = [int(m) for m in re.findall(r"^\[p0\] step (\d+)/60 loss", text, re.M)]
    # at a pace a person reads (issue 70: one every 2 s at most, the last always; said once),
    # every one of them in launcher.log
    assert steps[0] == 5 and steps[-1] == 60 and steps == sorted(set(steps)), text
    assert set(steps) <= set(range(5, 61, 5)) and len(steps) >= 3, text
    assert text.count("step lines on this terminal") == (len(steps) < 12), text
    logged = (run_dir / "launcher.log").read_text()
    assert re.findall(r"\[p0\] step (\d+)/60 loss", logged) == [str(s) for s in range(5, 61, 5)]
    assert "Gloo" not in text and "running |" not in text
    assert "Gloo" in (run_dir / "logs" / "process-003.log").read_text()  # it is there, in the log
    assert "OK: 4 processes succeeded" in text
    # the ETA is there and falls as the run goes on
    assert len(etas) >= 4, etas
    values = [eta for _, eta in etas]
    assert values[-1] < values[0], etas
    # a new step time may nudge it up, rarely: early on, one slow interval of a 4-process
    # run on 2 loaded cores moves the mean step time, so a rise counts when over half of it
    rises = [(a, b) for a, b in zip(values, values[1:]) if b > a + max(0.5, 0.5 * a)]
    assert len(rises) <= len(values) // 4, etas
