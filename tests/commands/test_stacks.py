"""Stacks before the kill (``launcher.run.stacks``): a real faulthandler dump read back, and
supervision in fake time asking scripted workers for theirs when the watchdog fires.

The dump's text comes from a real Python process answering ``STACKS_SIGNAL`` the way the
worker does (``worker.runtime.interrupts.answer_stack_requests``), while its main thread sleeps in
a function of its own and a second thread waits: what the launcher reads is CPython's own
format, not a copy of it.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from harness.fakes import FakeClock, FakeWorker, process_plan
from harness.helpers import REPO
from launcher import interrupts as interrupts_of_the_launcher
from launcher.console import Console
from launcher.console.status import summary
from launcher.run import stacks
from launcher.run import supervise as supervision
from launcher.state import Tracked, Watchdog
from worker import contract
from worker.contract import wire
from worker.runtime import interrupts

HANGS = textwrap.dedent("""\
    import sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from worker.runtime import interrupts

    def waiting_helper():
        threading.Event().wait()

    def hang_in_my_own_function():
        print("ready", flush=True)
        time.sleep(3600)

    interrupts.answer_stack_requests()
    threading.Thread(target=waiting_helper, name="helper", daemon=True).start()
    hang_in_my_own_function()
""")


def real_dump(tmp_path) -> list:
    """The lines a real process answers a stacks request with (stderr joined to stdout)."""
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    proc = subprocess.Popen([sys.executable, str(script), REPO], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.2)  # into the sleep
        os.kill(proc.pid, interrupts.STACKS_SIGNAL)
        tracked = Tracked(worker=None)
        tracked.stacks.begin()  # asked: its lines are the answer, not output
        got = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            line = proc.stdout.readline().rstrip("\n")
            assert not tracked.observe(line, time.monotonic()), line  # never for the console
            got.append(line)
            if line.startswith("  File") and "<module>" in line and len(stacks.threads(got)) == 2:
                break
        assert proc.poll() is None  # the request did not end it
        return tracked.stacks.lines
    finally:
        proc.kill()
        proc.wait()


def test_a_real_dump_is_read_into_threads_and_the_main_threads_own_function(tmp_path):
    lines = real_dump(tmp_path)
    found = stacks.threads(lines)
    assert len(found) == 2, lines                         # the main thread and the helper
    main = stacks.main_thread(found)
    assert main[-1].name == "<module>" and main[0].name == "hang_in_my_own_function", main
    assert stacks.where(main).startswith("hang_in_my_own_function (hangs.py:")
    helper = next(frames for frames in found if frames is not main)
    assert "waiting_helper" in [f.name for f in helper]
    # the innermost frame is the standard library's wait: the helper's own function leads
    assert stacks.where(helper).startswith("waiting_helper (hangs.py:")
    assert ", in wait (threading.py:" in stacks.where(helper)


def test_the_workers_main_thread_is_told_from_helper_threads_as_deep():
    """``python -m worker``: the main thread's outermost frame is runpy's, not ``<module>``;
    helper threads (the notice's watchers) as deep as it, listed first, are not it."""
    frame = stacks.Frame
    helper = [frame("/usr/lib/python3.11/threading.py", 327, "wait"),
              frame("/opt/podlaunch/worker/recovery/notice.py", 105, "_publish"),
              frame("/usr/lib/python3.11/threading.py", 982, "run"),
              frame("/usr/lib/python3.11/threading.py", 1002, "_bootstrap")]
    main = [frame("/home/me/jobs/my_task.py", 81, "on_step_end"),
            frame("/opt/podlaunch/worker/trainer/main.py", 177, "train"),
            frame("<frozen runpy>", 88, "_run_code"),
            frame("<frozen runpy>", 198, "_run_module_as_main")]
    assert stacks.main_thread([helper, main]) is main
    cut = main[:-1]
    assert stacks.main_thread([helper, cut]) is cut  # no runpy frame: the one not threading's


def test_library_and_worker_frames_are_not_the_jobs_own():
    frame = stacks.Frame
    assert not stacks.is_own(frame("/venv/lib/python3.11/site-packages/jax/_src/api.py", 1, "f"))
    assert not stacks.is_own(frame("/usr/lib/python3.11/threading.py", 1, "wait"))
    assert not stacks.is_own(frame(os.path.join(os.path.dirname(os.path.dirname(contract.__file__)), "trainer",
                                          "train.py"), 1, "train"))
    assert stacks.is_own(frame("/home/me/jobs/my_task.py", 3, "on_step_end"))
    frames = [frame("/venv/lib/python3.11/site-packages/jax/_src/array.py", 9, "block_until_ready"),
              frame("/opt/podlaunch/worker/trainer/train.py", 201, "train"),
              frame("<frozen runpy>", 88, "_run_code")]
    assert stacks.where(frames) == "train (train.py:201), in block_until_ready (array.py:9)"


def dump_text(function: str, path: str, line: int) -> list:
    return ["Thread 0x00007f0000000001 (most recent call first):",
            '  File "/usr/lib/python3.11/threading.py", line 320 in wait',
            '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap',
            "",
            "Current thread 0x00007f0000000002 (most recent call first):",
            f'  File "{path}", line {line} in {function}',
            '  File "/opt/podlaunch/worker/trainer/main.py", line 300 in main',
            '  File "<frozen runpy>", line 88 in <module>']


def progress(step: int) -> str:
    return wire.PROGRESS_FORMAT.format(step=step, num_steps=100, loss=0.5, steps_per_s=10.0,
                                           step_time_s=0.1, own_step_time_s=0.01)


def test_a_stall_reads_every_stack_before_the_kill_and_names_where_each_stands(tmp_path):
    clock = FakeClock()
    out = io.StringIO()
    console = Console(out, tty=False, status_every_s=0)
    log_dir = str(tmp_path)
    waiting = FakeWorker(clock, process_plan(0, log_dir), lines=[(0.5, progress(5))],
                         stacks=dump_text("block_until_ready",
                                          "/venv/lib/python3.11/site-packages/jax/_src/array.py", 9))
    hung = FakeWorker(clock, process_plan(1, log_dir), lines=[(0.5, progress(5))],
                      stacks=dump_text("on_step_end", "/home/me/faulty_task.py", 79))
    stopped = FakeWorker(clock, process_plan(2, log_dir), lines=[(0.4, progress(5))], stopped=True)
    silent = FakeWorker(clock, process_plan(3, log_dir), lines=[(0.5, progress(5))])  # never answers
    result = supervision.supervise([waiting, hung, stopped, silent], 3.0, console, poll_interval_s=0.05,
                                   watchdog=Watchdog(stall_timeout_s=4.0), clock=clock, sleep=clock.sleep)
    asked = [w.called("dump_stacks") for w in (waiting, hung, silent)]
    assert all(len(a) == 1 for a in asked) and not stopped.called("dump_stacks")
    stalled_at = asked[0][0]
    killed_at = min(w.called("kill")[0] for w in (waiting, hung, stopped, silent))
    # the capture came first, and never took longer than its deadline
    assert stalled_at <= killed_at <= stalled_at + stacks.DEADLINE_S + 0.2, (stalled_at, killed_at)
    text = summary(result)
    assert "stacks: p0 stands in main (main.py:300), in block_until_ready (array.py:9)" in text, text
    assert "stacks: p1 stands in on_step_end (faulty_task.py:79)" in text, text
    assert "stacks: p2 (stalled) could not be read" not in text  # the stopped one is named as such:
    assert "stacks: p2 could not be read: it is stopped (SIGSTOP or a tracer)" in text, text
    assert f"stacks: p3 could not be read: no answer within {stacks.DEADLINE_S:g} s" in text, text
    for process_id in (0, 1):  # every thread, beside the log
        written = (tmp_path / f"process-{process_id:03d}.stacks.txt").read_text()
        assert written.count("(most recent call first):") == 2
    assert not (tmp_path / "process-002.stacks.txt").exists()
    answer = json.loads((tmp_path / stacks.ANSWER_FILE).read_text())
    assert answer["why"] == "stalled" and sorted(answer["files"]) == ["0", "1"]
    assert sorted(answer["unread"]) == ["2", "3"]
    # the dumps never reached the console's lines or the tail
    assert "most recent call first" not in out.getvalue().split("stacks (stalled)")[0]
    assert all("most recent call first" not in line for t in result.processes for line in t.tail)


def test_many_processes_are_summarised_by_where_they_stand():
    capture = stacks.Capture(standing={i: "allreduce (collectives.py:10)" for i in range(12)})
    capture.standing[7] = "on_step_end (task.py:5)"
    labels = {i: f"p{i}" for i in range(12)}
    lines = capture.lines(labels, focus=7)
    assert lines == ["stacks: p7 (stalled) stands in on_step_end (task.py:5)",
                     "stacks: 1 process (p7) stands elsewhere than the rest: in on_step_end (task.py:5)",
                     "stacks: the rest (11 processes) stand in allreduce (collectives.py:10)"]


def test_a_live_run_answers_a_stacks_request_to_its_launcher(tmp_path):
    clock = FakeClock(interrupts=[1.0], on_interrupt=lambda: os.kill(os.getpid(),
                                                                     signal.SIGUSR2))
    out = io.StringIO()
    console = Console(out, tty=False, status_every_s=0)
    worker = FakeWorker(clock, process_plan(0, str(tmp_path)),
                        lines=[(0.5, progress(5)), (2.0, progress(10)), (2.5, "done")],
                        exit=None, stacks=dump_text("train_step", "/home/me/task.py", 12))
    worker.end = (3.0, __import__("launcher.state", fromlist=["Exited"]).Exited(0))
    with interrupts_of_the_launcher.stacks_requests():  # as launch does for its whole run
        result = supervision.supervise([worker], 3.0, console, poll_interval_s=0.05, clock=clock,
                                       sleep=clock.sleep)
    assert result.exit_code == 0 and len(worker.called("dump_stacks")) == 1
    assert "stacks (asked by launch stacks): read 1 of 1 process" in out.getvalue()
    assert "stacks: p0 stands in train_step (task.py:12)" in out.getvalue()
    assert (tmp_path / "process-000.stacks.txt").exists()
    assert result.stacks == []  # asked on a live run: not part of the summary


def test_ctrl_c_on_a_run_that_looks_hung_reads_the_stacks_first(tmp_path):
    clock = FakeClock(interrupts=[stacks.LOOKS_HUNG_S + 5])
    out = io.StringIO()
    console = Console(out, tty=False, status_every_s=0)
    workers = [FakeWorker(clock, process_plan(i, str(tmp_path)), lines=[(0.5, progress(5))],
                          stacks=dump_text("on_step_end", "/home/me/task.py", 3 + i)) for i in range(2)]
    result = supervision.supervise(workers, 3.0, console, poll_interval_s=0.05, clock=clock,
                                   sleep=clock.sleep)
    assert result.exit_code == 130
    said = out.getvalue()
    assert re.search(r"the run looks hung \(p0: no step progress for 3[45] s; reading every "
                     r"process's stacks first, at most 3 s\)", said), said
    assert "stacks: p1 stands in on_step_end (task.py:4)" in summary(result)
    assert all(len(w.called("dump_stacks")) == 1 for w in workers)
    assert all(w.called("dump_stacks")[0] <= w.called("terminate")[0] for w in workers)
    # a Ctrl-C on a run that steps does not wait for stacks
    clock = FakeClock(interrupts=[2.0])
    live = [FakeWorker(clock, process_plan(0, str(tmp_path)), lines=[(0.5, progress(5)), (1.5, progress(6))])]
    supervision.supervise(live, 3.0, Console(io.StringIO(), tty=False, status_every_s=0),
                          poll_interval_s=0.05, clock=clock, sleep=clock.sleep)
    assert live[0].called("dump_stacks") == []


def test_launch_stacks_needs_a_live_run_on_this_machine(tmp_path):
    from launcher.commands import stacks as stacks_command
    from launcher.rundir import record as runs
    from launcher.errors import SpecError

    with pytest.raises(SpecError, match="no run or job '.*' under .*; give a run directory"):
        stacks_command.main([str(tmp_path)])
    record = runs.Record(str(tmp_path), "linear", 10)
    record.start()
    record.end("succeeded")
    with pytest.raises(SpecError, match=r"is not running \(state 'succeeded'"):
        stacks_command.main([str(tmp_path)])
    data = json.loads((tmp_path / "run.json").read_text())
    data.update(state="running", launcher={"pid": os.getpid(), "host": "elsewhere"})
    (tmp_path / "run.json").write_text(json.dumps(data))
    with pytest.raises(SpecError, match="its launcher runs on elsewhere"):
        stacks_command.main([str(tmp_path)])


def test_a_dump_nobody_asked_for_is_output_like_any_other():
    """Python's own dump on a fatal error (faulthandler) has the same shape as an answer:
    outside a capture it reaches the log, the console and the failure's tail."""
    tracked = Tracked(worker=None)
    for line in ["Fatal Python error: Segmentation fault", ""] + dump_text("f", "/x/task.py", 3):
        assert tracked.observe(line, 0.0), line
    assert "Current thread 0x00007f0000000002 (most recent call first):" in tracked.tail
    assert tracked.stacks.lines == []


def test_launch_stacks_and_profile_take_a_jobs_name_as_every_run_command_does(tmp_path):
    # a newcomer's report: `launch stacks linear` refused, advising the very name it refused
    from launcher.commands import profile as profile_command, stacks as stacks_command
    from launcher.rundir import record as runs
    from launcher.errors import SpecError

    run_dir = tmp_path / "runs" / "linear" / "20261206-120000-000"
    run_dir.mkdir(parents=True)
    record = runs.Record(str(run_dir), "linear", 10)
    record.start()
    record.end("succeeded")
    for command in (stacks_command, profile_command):
        for name in ("linear", "linear/20261206-120000-000", "20261206-120000-000"):
            with pytest.raises(SpecError, match=rf"the run in {re.escape(str(run_dir))} is not "
                                                r"running \(state 'succeeded'"):
                command.main([name, "--root", str(tmp_path / "runs")])
