"""Profiles: ``jax.profiler`` traces of chosen steps from every process, asked by the spec's
``profile`` section or by ``launch profile`` on a live run, served by ``launch tensorboard``
in TensorBoard's profile plugin (xprof), looked at in headless Chromium."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import time
import types

import pytest

from harness.fakes import FakeClock, FakeWorker, process_plan
from harness.served import check_served
from harness.helpers import LAUNCH, REPO, env_for_tests, launch, launched, program_job
from harness.runs import SLOW_PROCESS_0, assert_same_params, params
from launcher import interrupts as launcher_interrupts, logtimes
from launcher.commands import profile as profile_command, tensorboard as tensorboard_command
from launcher.console import Console
from launcher.console.status import summary
from launcher.console.traced import session_lines
from launcher.errors import SpecError
from launcher.run import profiles
from launcher.backends.ssh import fetches as ssh_fetches
from launcher.run import supervise as supervision
from launcher.ends import Exited
from launcher.stats import ProcessStats
from worker.contract import wire
from worker.contract import profiling, sections
from worker.telemetry.profiler import Profiler


def progress(step: int, num_steps: int = 1000, steps_per_s: float = 10.0) -> str:
    return wire.PROGRESS_FORMAT.format(step=step, num_steps=num_steps, loss=0.5,
                                           steps_per_s=steps_per_s, step_time_s=1 / steps_per_s,
                                           own_step_time_s=0.01)


# ---- fast: the pieces ----------------------------------------------------------------
def test_a_trace_line_is_read_back_and_a_slowest_process_that_kept_none_says_so():
    line = profiling.LINE_FORMAT.format(first=20, last=25, session="steps_20-25", seconds=0.3,
                                        ms_per_step=50.0, kept="tensorboard/plugins/profile/"
                                        "steps_20-25/process_1.xplane.pb")
    trace = profiling.parse(line)
    assert (trace.first, trace.last, trace.session, trace.ms_per_step) == (20, 25, "steps_20-25", 50.0)
    assert trace.path == os.path.relpath(profiling.trace_path(".", "steps_20-25", 1))
    dropped = profiling.parse(line.rsplit(": ", 1)[0] + ": " + profiling.NOT_KEPT
                              + " (profile.processes: slowest; process 0 was slower)")
    assert dropped.path is None
    assert profiling.parse("step 20/100 loss 0.5") is None
    assert profiling.parse(line.replace("(steps_20-25)", "(..)")) is None  # no session outside


@pytest.mark.parametrize("setting, message", [
    ("profile.start_step=98", r"profile\.start_step: steps 98-102 \(profile\.num_steps 5\) run past "
                              r"the job's last step, train\.num_steps 100"),
    ("profile.start_step=0", r"profile\.start_step: expected a number > 0"),
    ("profile.num_steps=0", r"profile\.num_steps: expected 1 to 10000"),
    ("profile.processes=fastest", r"profile\.processes: expected one of all, slowest"),
])
def test_a_bad_profile_section_is_bad_input_and_starts_nothing(tmp_path, setting, message):
    result = launch("jobs/linear.yaml", "--set", setting, "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert re.search(message, result.stderr), result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("start, message", [
    ("18", "program.num_steps 20"), ("1", "the first step it can trace is 2")])
def test_a_program_profile_it_cannot_trace_is_bad_input(tmp_path, start, message):
    spec = program_job(tmp_path, steps=20)
    result = launch(spec, "--set", f"profile.start_step={start}", "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_a_live_request_reaches_every_process_ahead_of_the_furthest_and_is_answered(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()

    def ask() -> None:  # two launch profile at once: two requests, taken one after the other
        (tmp_path / f"{profiles.REQUEST_PREFIX}1-1.json").write_text(json.dumps({"num_steps": 4, "at": 12.5}))
        (tmp_path / f"{profiles.REQUEST_PREFIX}2-1.json").write_text(json.dumps({"num_steps": 3, "at": 13.5}))
        os.kill(os.getpid(), signal.SIGUSR1)
    clock = FakeClock(interrupts=[2.0], on_interrupt=ask)
    out = io.StringIO()
    console = Console(out, tty=False, status_every_s=0)
    workers = [FakeWorker(clock, process_plan(i, str(logs)),
                          lines=[(0.5, progress(5 + i)), (1.5, progress(10 + i)), (6.0, "done")],
                          trace_ms_per_step=20.0 + 30.0 * i) for i in range(2)]
    for w in workers:
        w.end = (6.5, Exited(0))
    with launcher_interrupts.stacks_requests():  # as launch does for its whole run
        result = supervision.supervise(workers, 3.0, console, poll_interval_s=0.05, clock=clock,
                                       sleep=clock.sleep)
    assert result.exit_code == 0
    asked = [[json.loads(text) for text in w.profile_requests] for w in workers]
    # the furthest process was at step 11 at 10 steps/s: LEAD_S (3 s) ahead is step 41
    assert asked[0] == asked[1] == [{"session": "steps_41-44", "start_step": 41, "num_steps": 4},
                                    {"session": "steps_41-43", "start_step": 41, "num_steps": 3}]
    assert not profiles.pending(str(tmp_path))  # both taken
    said = out.getvalue()
    assert "profile steps_41-44: asked 2 processes to trace steps 41-44 (launch profile)" in said
    assert "steps 41-44 traced by 2 processes; slowest p1 (50.00 ms per step; fastest p0 20.00)" in said
    where = os.path.join(str(tmp_path), profiling.PLUGIN_DIR, "steps_41-44")
    assert f"2 traces in {where}/ (process_0.xplane.pb, process_1.xplane.pb)" in said
    answer = json.loads((logs / profiles.ANSWER_FILE).read_text())  # the newest: the second's
    assert answer["asked_at"] == 13.5 and answer["session"] == "steps_41-43"
    assert (answer["asked"], answer["traced"]) == (2, 2)
    assert answer["files"] == {str(i): os.path.join(where.replace("41-44", "41-43"),
                                                    f"process_{i}.xplane.pb") for i in range(2)}
    assert "slowest p1 (50.00 ms per step" in summary(result)
    # a run near its end: the window still fits before the last step
    stats = ProcessStats()
    stats.observe(progress(990))
    assert profiles.Answers.first_step([types.SimpleNamespace(last_step=990, stats=stats)], 5) == 996


@pytest.mark.parametrize("text", [
    '{"session": "evil", "start_step": Infinity, "num_steps": 3}',
    '{"session": "evil", "start_step": 1e400, "num_steps": 3}',
    '{"session": "evil", "start_step": true, "num_steps": 3}',
    '{"session": "evil", "start_step": 5, "num_steps": 0}',
    '{"session": "%s", "start_step": 5, "num_steps": 3}' % ("x" * 300),
    '{"session": "../up", "start_step": 5, "num_steps": 3}',
    "[" * 200000,
    "not json",
])
def test_a_hand_written_request_a_worker_cannot_use_is_said_and_ignored(tmp_path, text):
    said = []
    profiler = Profiler(str(tmp_path), 0, 2, sections.Profile(), out=said.append)
    (tmp_path / profiling.STEPS_FILE).write_text(text)
    profiler._poll(5)
    assert profiler.windows == [] and len(said) == 1 and said[0].startswith("profile: ignored "), said


def test_a_live_request_beside_the_specs_window_traces_both_in_step_order(tmp_path):
    profiler = Profiler(str(tmp_path), 0, 2, sections.Profile(start_step=2500, num_steps=5))
    profiling.write_request(str(tmp_path), json.dumps({"session": "steps_263-265", "start_step": 263,
                                                       "num_steps": 3}))
    profiler._poll(100)
    assert profiler.windows == [(263, 265, "steps_263-265"), (2500, 2504, "steps_2500-2504")]
    profiler._poll(300)  # the same request, read once
    assert len(profiler.windows) == 2
    os.utime(tmp_path / profiling.STEPS_FILE, ns=(1, 1))  # written again for the next process
    profiler._poll(300)  # of this host: the same session, not a second window
    assert len(profiler.windows) == 2
    # a request that was there before this process started is an earlier attempt's
    assert Profiler(str(tmp_path), 0, 2, sections.Profile()).windows == []


def test_a_window_the_process_is_late_for_is_traced_from_there_for_as_many_steps(tmp_path):
    # traced in turn: a spec window begun while a live one was traced, a live one inside the
    # spec's; each as many steps as asked, from where the process stands (jax stubbed out:
    # only the order of starts and stops is looked at here)
    profiler = Profiler(str(tmp_path), 0, 1, sections.Profile(start_step=1502, num_steps=5))
    traced = []
    profiler._start = lambda first, session, last: setattr(profiler, "tracing", (first, session, 0, "", last))
    profiler._stop = lambda last: (traced.append((profiler.tracing[0], last, profiler.tracing[1])),
                                   setattr(profiler, "tracing", None))
    profiler.windows.insert(0, (1500, 1504, "steps_1500-1504"))  # as _poll puts a request
    profiler.windows.append((1503, 1503, "steps_1503-1503"))
    for step in range(1490, 1530):
        profiler.before(step, step)
        profiler.after(step, lambda: None)
    assert traced == [(1500, 1504, "steps_1500-1504"), (1505, 1509, "steps_1502-1506"),
                      (1510, 1510, "steps_1503-1503")]
    # a resumed attempt does not trace again what it resumed past
    resumed = Profiler(str(tmp_path), 0, 1, sections.Profile(start_step=20, num_steps=5))
    resumed._start = lambda *a: pytest.fail("traced a window it resumed past")
    resumed.before(31, 31)


def test_a_request_that_is_not_a_regular_file_is_never_waited_on(tmp_path):
    said = []
    profiler = Profiler(str(tmp_path), 0, 2, sections.Profile(), out=said.append)
    os.mkfifo(tmp_path / profiling.STEPS_FILE)  # opened as it is, the read would wait forever
    profiler._poll(5)
    assert profiler.windows == [] and "is not a regular file" in said[0], said


def test_a_request_waits_for_every_process_to_report_a_step_and_a_bad_one_is_ignored(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    # left by the attempt before (a restart): taken once this attempt's processes step
    (tmp_path / f"{profiles.REQUEST_PREFIX}1-1.json").write_text(json.dumps({"num_steps": 2, "at": 1.0}))
    (tmp_path / f"{profiles.REQUEST_PREFIX}2-1.json").write_text('{"num_steps": 1e400}')
    (tmp_path / f"{profiles.REQUEST_PREFIX}0-0.json").mkdir()  # cannot be read or removed
    os.mkfifo(tmp_path / f"{profiles.REQUEST_PREFIX}0-1.json")  # must not be waited on
    clock = FakeClock()
    out = io.StringIO()
    workers = [FakeWorker(clock, process_plan(i, str(logs)), lines=[(0.5 + i, progress(5 + i)),
                                                                     (6.0, "done")],
                          trace_ms_per_step=10.0) for i in range(2)]
    for w in workers:
        w.end = (6.5, Exited(0))
    result = supervision.supervise(workers, 3.0, Console(out, tty=False, status_every_s=0),
                                   poll_interval_s=0.05, clock=clock, sleep=clock.sleep)
    assert result.exit_code == 0
    # p1's first step came at 1.5 s: nothing was asked before; then from where they stood
    assert all(w.called("request_profile")[0] >= 1.5 for w in workers)
    assert json.loads(workers[0].profile_requests[0])["start_step"] == 6 + 30
    said = out.getvalue()
    assert re.search(r"profile: the request \S+2-1\.json could not be read \(ValueError: "
                     r"num_steps inf: expected 1 to 10000\); ignored", said), said
    assert said.count("0-0.json could not be read") == 1 and said.count("0-1.json could not be read") == 1
    assert "Traceback" not in said
    assert [os.path.basename(p) for p in profiles.pending(str(tmp_path))] == [
        f"{profiles.REQUEST_PREFIX}0-0.json"]  # the directory alone is left


def test_a_host_may_hand_back_only_its_own_process_trace(tmp_path):
    said = []
    console = types.SimpleNamespace(say=said.append)
    fetch = ssh_fetches.trace_fetcher(types.SimpleNamespace(name="host-b"), 1, "/remote", str(tmp_path),
                                       console)
    line = profiling.LINE_FORMAT.format(first=1, last=2, session="steps_1-2", seconds=0.1,
                                        ms_per_step=5.0, kept="tensorboard/plugins/profile/"
                                        "steps_1-2/process_0.xplane.pb")
    fetch(line)  # process 1's host claims process 0's trace
    assert said == ["host-b: not copying 'tensorboard/plugins/profile/steps_1-2/process_0.xplane.pb': "
                    "not p1's trace path"]


def test_a_request_at_the_runs_last_step_says_nothing_is_left_and_ties_are_named_as_such(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    clock = FakeClock()
    out = io.StringIO()
    workers = [FakeWorker(clock, process_plan(i, str(logs)),
                          lines=[(0.5, progress(1000, 1000)), (3.0, "done")]) for i in range(2)]
    for w in workers:
        w.end = (3.5, Exited(0))
    (tmp_path / f"{profiles.REQUEST_PREFIX}1-1.json").write_text(json.dumps({"num_steps": 5, "at": 7.0}))
    supervision.supervise(workers, 3.0, Console(out, tty=False, status_every_s=0),
                          poll_interval_s=0.05, clock=clock, sleep=clock.sleep)
    assert "profile: the run is at its last step (1000): no step is left to trace" in out.getvalue()
    assert all(w.profile_requests == [] for w in workers)  # no empty window sent
    answer = json.loads((logs / profiles.ANSWER_FILE).read_text())
    assert (answer["asked_at"], answer["asked"], answer["traced"]) == (7.0, 2, 0)
    tie = {p: profiling.Trace(5, 9, "steps_5-9", 0.04, 7.81, None) for p in (0, 1)}
    assert "traced by 2 processes; all at 7.81 ms per step" in session_lines(
        "steps_5-9", tie, {0: "p0", 1: "p1"}, "/r")[0]


def test_an_answer_that_is_not_a_regular_file_is_skipped_not_waited_on(tmp_path):
    from launcher.commands import stacks as stacks_command

    (tmp_path / "logs" / "attempt-1").mkdir(parents=True)
    os.mkfifo(tmp_path / "logs" / profiles.ANSWER_FILE)
    (tmp_path / "logs" / "attempt-1" / profiles.ANSWER_FILE).write_text(json.dumps({"at": 5.0}))
    assert stacks_command.answers(str(tmp_path), profiles.ANSWER_FILE) == [{"at": 5.0}]


def test_launch_profile_needs_a_live_run_and_a_step_count_it_can_trace(tmp_path):
    with pytest.raises(SpecError, match="no run or job '.*' under .*; give a run directory"):
        profile_command.main([str(tmp_path)])
    with pytest.raises(SpecError, match=r"--steps: expected 1 to 10000, got 0"):
        profile_command.main([str(tmp_path), "--steps", "0"])
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(SpecError, match=r"--timeout-s: expected a number of seconds > 0"):
            profile_command.main([str(tmp_path), "--timeout-s", bad])


def test_launch_tensorboard_links_each_runs_profiles_and_names_the_plugin_to_install(tmp_path):
    run = tmp_path / "run"
    (run / "tensorboard").mkdir(parents=True)
    links = tmp_path / "links"
    links.mkdir()
    (name,) = tensorboard_command.link_runs([str(run)], str(links))
    inside = links / f"{name} {tensorboard_command.PROFILES_SUFFIX}" / "plugins" / "profile"
    assert os.readlink(inside) == str(run / "tensorboard" / "plugins" / "profile")
    assert tensorboard_command.profile_note([str(run)], installed=False) is None  # no trace: no word
    (run / profiling.PLUGIN_DIR / "steps_3-4").mkdir(parents=True)
    note = tensorboard_command.profile_note([str(run)], installed=False)
    assert "1 profile session" in note and "-m pip install xprof, then run this again" in note
    assert "Profile tab" in tensorboard_command.profile_note([str(run)], installed=True)


# ---- slow: real runs, TensorBoard and Chromium ------------------------------------------
@pytest.mark.slow
def test_a_spec_profile_traces_every_process_and_tensorboard_shows_each(tmp_path, reference_params):
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--set", "profile.start_step=20", "--set", "profile.num_steps=6",
                    "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    for p in (0, 1):
        assert os.path.getsize(profiling.trace_path(str(run_dir), "steps_20-25", p)) > 10000
        log = logtimes.read_text(run_dir / "logs" / f"process-{p:03d}.log")
        assert re.search(r"^profile of steps 20-25 \(steps_20-25\): ", log, re.M), log
    # processes in lockstep may tie at the printed precision: then "all at", not "slowest"
    assert re.search(r"profile steps_20-25: steps 20-25 traced by 2 processes; "
                     r"(slowest p[01] |all at \d+\.\d\d ms per step)", result.stdout), result.stdout
    assert f"2 traces in {run_dir}/tensorboard/plugins/profile/steps_20-25/" in result.stdout
    assert not list((run_dir / profiling.PLUGIN_DIR).glob(".tracing-*"))  # nothing half-written left
    assert_same_params(params(run_dir), reference_params())  # a profile changes no step
    check_served(run_dir, "steps_20-25", [0, 1], 20)


SLOW = (*SLOW_PROCESS_0, "--set", "checkpoint.local_every_steps=0")  # reference_params()'s params
# a live request must land before the run ends: under a CI run `launch profile` itself took
# longer than the 90 steps' 4.5 s left at 0.05 s a step (asked steps 96-100: process 1 had
# ended), as it did over ssh (tests/backends/ssh/test_ssh_profile.py)
SLOWER = ("--set", "task.args.sleep_s=0.2")


@pytest.mark.slow
def test_launch_profile_on_a_live_run_traces_every_process_and_changes_no_param(tmp_path,
                                                                                reference_params):
    run_dir = tmp_path / "run"
    with launched("jobs/linear.yaml", *SLOW, *SLOWER, "--run-dir", str(run_dir)) as out:
        out.wait_for(r"\[p0\] step 10/100", 120)
        began = time.monotonic()
        asked = subprocess.run(LAUNCH + ["profile", str(run_dir), "--steps", "5", "--timeout-s", "60"],
                               cwd=REPO, env=env_for_tests(), capture_output=True, text=True, timeout=90)
        took_s = time.monotonic() - began
        assert asked.returncode == 0, asked.stdout + asked.stderr
        session = re.search(r"profile (steps_(\d+)-(\d+)): steps \d+-\d+(, \d+-\d+)* traced by "
                            r"2 processes", asked.stdout)
        assert session and int(session[3]) - int(session[2]) == 4, asked.stdout
        for p in (0, 1):
            path = profiling.trace_path(str(run_dir), session[1], p)
            assert f"process {p}: {path}" in asked.stdout and os.path.getsize(path) > 10000
        assert took_s < 30, took_s
        code, text = out.finish(300)
    assert code == 0, text[-3000:]
    assert_same_params(params(run_dir), reference_params())


@pytest.mark.slow
def test_a_program_job_profiles_through_the_program_api_and_keeps_the_slowest(tmp_path):
    spec = program_job(tmp_path, steps=20, num_processes=2)
    run_dir = tmp_path / "run"
    result = launch(spec, "--set", "profile.start_step=6", "--set", "profile.num_steps=4",
                    "--set", "profile.processes=slowest", "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    lines = [profiling.parse(line) for p in (0, 1)
             for line in logtimes.read_text(run_dir / "logs" / f"process-{p:03d}.log").splitlines()
             if profiling.parse(line) is not None]
    assert [(t.first, t.last) for t in lines] == [(6, 9), (6, 9)], lines
    kept = [t for t in lines if t.path is not None]
    assert len(kept) == 1 and (run_dir / kept[0].path).exists()  # the slowest's trace alone
    slowest = max(lines, key=lambda t: t.ms_per_step)
    assert kept[0] == slowest
    assert len(list((run_dir / profiling.PLUGIN_DIR / "steps_6-9").iterdir())) == 1
    assert "profile steps_6-9: 1 trace in " in result.stdout, result.stdout
