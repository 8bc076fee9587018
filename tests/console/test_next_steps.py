"""Every run ends with next steps that work with what the README installed (issue 50, item 2):
``launch tensorboard RUN`` (never a ``tensorboard`` the install may lack), the exact command
that continues a failed or stopped run, and after a first success where to go next. The
commands a run prints are run here as printed."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal

import pytest

from harness.helpers import NO_RESTARTS, REPO, Output, launch, start_launch
from harness.runs import fault


def _printed(out: str, prefix: str) -> str:
    """The command on the console's line under the sentence that starts with ``prefix``: one
    line of its own, as a terminal's selection takes it."""
    found = re.search(rf"^podlaunch: {re.escape(prefix)}.*\npodlaunch:   (\S.*)$", out, re.M)
    assert found, out
    return found.group(1).strip()


def _run_printed(command: str, cwd: str = REPO):
    argv = shlex.split(command)
    assert argv[0] == "launch", command
    return launch(*argv[1:], cwd=cwd)


def _last_lines(out: str, count: int) -> list:
    return [line for line in out.splitlines() if line.strip()][-count:]


def test_an_install_is_said_before_the_command_that_needs_it_and_works_from_any_directory(
        tmp_path, monkeypatch):
    """Issue 70: every summary said ``pip install -e '.[tensorboard]'`` (beside the view
    command), which fails outside the clone, where a user's own program lives; and a profile's
    line pointed to the Profile tab with no word that it needs xprof. Now each install comes
    first, on its own, as a PyPI install into the launcher's own Python, and it works typed in
    a directory that is not the clone (here: already installed, so nothing is downloaded)."""
    import subprocess
    import sys

    from launcher.console import nextsteps, traced
    from worker.contract import profiling

    run_dir = str(tmp_path / "run")
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    lines = nextsteps.closing("jobs/linear.yaml", run_dir, 0, True)
    first = f"{shlex.quote(sys.executable)} -m pip install tensorboard"
    assert lines[1:3] == [f"TensorBoard is not installed here; first: {first}",
                          f"view: {nextsteps.launch_word()} tensorboard {run_dir}"], lines
    monkeypatch.setitem(sys.modules, "xprof", None)
    trace = profiling.Trace(3, 4, "steps_3-4", 0.005, 2.5, "p0.xplane.pb")
    said = traced.session_lines("steps_3-4", {0: trace}, {0: "p0"}, run_dir)[-1]
    plugin = f"{shlex.quote(sys.executable)} -m pip install xprof"
    assert said.endswith(f"; the Profile tab needs TensorBoard's profile plugin, first: {plugin}; "
                         f"then see it with: launch tensorboard {run_dir} (the Profile tab)"), said
    monkeypatch.delitem(sys.modules, "tensorboard")
    monkeypatch.delitem(sys.modules, "xprof")
    assert nextsteps.closing("jobs/linear.yaml", run_dir, 0, True)[1].startswith("view: ")
    for command in (first, plugin):
        done = subprocess.run(shlex.split(command) + ["--no-index", "--quiet"], cwd=str(tmp_path),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (command, done.stdout + done.stderr)


@pytest.mark.slow
def test_a_failed_run_ends_with_the_command_that_continues_it_and_that_command_does(tmp_path):
    run_dir = str(tmp_path / "run")
    args = ("jobs/linear.yaml", "--set", "train.num_steps=40", "--set", "checkpoint.every_steps=10",
            *fault("raise", 25), *NO_RESTARTS)
    failed = launch(*args, "--run-dir", run_dir)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "tensorboard --logdir" not in failed.stdout
    assert _last_lines(failed.stdout, 3)[0] == f"podlaunch: view: launch tensorboard {run_dir}", \
        failed.stdout
    # a program error: the fix first, then the resume from the checkpoint the run saved
    command = _printed(failed.stdout, "a restart with the same settings repeats this failure: fix "
                       "its cause (above) first, then continue from the checkpoint of step 20")
    assert command == f"launch resume {run_dir}", command
    resumed = _run_printed(command, cwd=str(tmp_path))  # from another directory
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "(resuming; attempt 1)" in resumed.stdout
    assert "continue this" not in resumed.stdout  # a success ends without one


@pytest.mark.slow
def test_a_stopped_run_says_interrupt_reports_the_saved_step_and_ends_with_the_resume_command(
        tmp_path):
    """Also issue 50, item 3: Ctrl-C is an interrupt on the console (the worker's log keeps its
    "preemption notice" words), and the summary's steps are the step saved, not the last
    logged one."""
    run_dir = str(tmp_path / "run")
    proc = start_launch("jobs/linear.yaml", "--set", "train.num_steps=1000000",
                        "--set", "cluster.devices_per_process=1", "--set", "task.name=faulty_task:make",
                        "--set", "task.args.sleep_s=0.05", "--set", "task.args.slow_process_id=0",
                        "--run-dir", run_dir)
    out = Output.of(proc)
    out.wait_for(r"^\[p0\] step 20/", 120)
    proc.send_signal(signal.SIGINT)
    code, text = out.finish(60)
    assert code == 130, text
    assert "preemption notice" not in text, text
    agreed = int(re.search(r"^\[p0\] interrupt \(Ctrl-C\): every process stops after step (\d+); "
                           r"process 0 saves it$", text, re.M).group(1))
    assert f"checkpoint of step {agreed} saved" in text
    with open(os.path.join(run_dir, "logs", "process-000.log"), encoding="utf-8") as f:
        # the launcher's SIGTERM reaches every process: whichever's watcher is first names itself
        # (process 1 of a 2 x 1 run under CI's load, once: "from process 1")
        said = f.read()
        assert re.search(rf"^\S+ preemption notice from process [01]: every process stops after "
                         rf"step {agreed}; process 0 saves it$", said, re.M), said
    rows = re.findall(r"^p\d+\s+localhost\s+stopped\s+exit code \d+\s+(\d+) ", text, re.M)
    assert rows == [str(agreed)] * 2, text
    with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
        assert json.load(f)["step"] == agreed  # launch runs says the saved step too
    command = _printed(text, f"continue this stopped run from its checkpoint of step {agreed} ")
    assert command == f"launch resume {run_dir}"


@pytest.mark.slow
def _shape(line: str, here: str) -> str:
    """A console line as the README's sample is held to it: ``here`` (the run's clone) as
    ``/path``, the entry point by any path as ``launch``, every number as ``#``, blanks as one,
    and the largest badput's name (the machine's load decides it) as ``BUCKET``."""
    line = re.sub(r"(?<!\S)\S*/launch(?=\s|$)", "launch", line.replace(here, "/path"))
    line = re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "#", line)
    return " ".join(re.sub(r"\(badput\): [^#]+ #", "(badput): BUCKET #", line).split())


def test_a_first_success_points_to_runs_more_processes_and_another_cluster(tmp_path,
                                                                        own_compilation_cache):
    """Also issue 70, item 8: the README's sample output of its first command, right under
    it, is this run's output (numbers, paths and the entry point's path aside; the step
    lines its ``...`` leaves out, and the status lines a pipe gets, aside)."""
    shutil.copytree(os.path.join(REPO, "jobs"), tmp_path / "jobs")
    first = launch("jobs/linear.yaml", cwd=str(tmp_path))  # the README's first command
    assert first.returncode == 0, first.stdout + first.stderr
    out = first.stdout
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    sample = re.search(r"^```\n(podlaunch: run directory .*?)^```$", readme, re.S | re.M).group(1)
    head, tail = (part.splitlines() for part in sample.split("\n...\n"))
    printed = [line for line in out.splitlines() if not line.startswith("podlaunch: status:")]
    # the README's first command installs podlaunch alone, so its sample holds the install
    # hint a new user sees; the suite's venv has TensorBoard, where the hint is not printed
    hint = "podlaunch: TensorBoard is not installed here; first:"
    if not any(line.startswith(hint) for line in printed):
        tail = [line for line in tail if not line.startswith(hint)]
    assert [_shape(line, str(tmp_path)) for line in printed[:len(head)] + printed[-len(tail):]] \
        == [_shape(line, "/path") for line in head + tail], \
        "README.md's sample under its first command: paste this run's output\n" + "\n".join(printed)
    assert "podlaunch: next steps:" in out, out
    lines = out[out.index("podlaunch: next steps:"):].splitlines()[1:]
    commands = [line.split("podlaunch:   ", 1)[1].split("   ")[0].strip() for line in lines
                if line.startswith("podlaunch:   launch ")]
    job = tmp_path / "jobs" / "linear.yaml"  # paths that work from any directory
    assert commands == ["launch runs", f"launch {job} --set cluster.num_processes=4",
                        f"launch {job} --cluster {tmp_path / 'jobs' / 'clusters' / 'ssh-example.yaml'}"], lines
    assert "docs/glossary.md" in out and os.path.isfile(os.path.join(REPO, "docs", "glossary.md"))
    assert "your runs" in lines[0]
    listed = _run_printed(commands[0], cwd=str(tmp_path))
    assert listed.returncode == 0 and "linear" in listed.stdout, listed.stdout + listed.stderr
    more = _run_printed(commands[1] + " --set train.num_steps=20", cwd=str(tmp_path))
    assert more.returncode == 0, more.stdout + more.stderr
    assert "OK: 4 processes succeeded" in more.stdout
    assert "next steps:" not in more.stdout  # the pointer is for the first run only
    # another cluster needs its hosts; the file and the pages it names are there to edit
    cluster = commands[2].split("--cluster ", 1)[1]
    assert os.path.isfile(cluster), cluster
    for page in re.findall(r"docs/\w+\.md", lines[2]):
        assert os.path.isfile(os.path.join(REPO, page)), page


@pytest.mark.slow
def test_next_steps_are_written_with_the_launch_that_ran_where_launch_is_not_on_path(tmp_path):
    """A newcomer's report: the README's first command runs `.venv/bin/launch`, then the run
    suggested `launch runs`: command not found in that shell. Without the venv on PATH, each
    next step names this install's entry point, and runs as printed in a plain shell."""
    import subprocess
    import sys

    from harness.helpers import env_for_tests

    entry = os.path.join(os.path.dirname(sys.executable), "launch")
    bin_dir = os.path.dirname(entry)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and os.path.realpath(p) != os.path.realpath(bin_dir))
    env = env_for_tests(PATH=path, XDG_STATE_HOME=str(tmp_path / "state"))
    shutil.copytree(os.path.join(REPO, "jobs"), tmp_path / "jobs")
    first = subprocess.run([entry, "jobs/linear.yaml", "--set", "train.num_steps=5", "--set",
                            "cluster.num_processes=1"], cwd=str(tmp_path), env=env,
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert first.returncode == 0, first.stdout + first.stderr
    word = shlex.quote(entry)  # not under tmp_path: its absolute path
    assert f"podlaunch:   {word} runs " in first.stdout, first.stdout
    assert f"podlaunch: view: {word} tensorboard " in first.stdout
    listed = subprocess.run(f"{word} runs", shell=True, cwd=str(tmp_path), env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "linear" in listed.stdout, listed.stdout + listed.stderr


@pytest.mark.slow
def test_a_diverged_loss_ends_with_a_fix_and_no_resume_or_retry_of_the_same_settings(tmp_path):
    """A newcomer's report: after optimizer.learning_rate=1000 made the loss inf, the console
    offered `--set optimizer.learning_rate=1000 --resume RUN` (no checkpoint: it starts at step
    1 and diverges again) and "set it to retry program errors" right after saying a restart
    repeats it. Now: no retry hint, no --resume, a new run with a tenth of the rate, which runs."""
    run_dir = str(tmp_path / "run")
    failed = launch("jobs/linear.yaml", "--set", "optimizer.learning_rate=1000", "--run-dir", run_dir)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    tail = "\n".join(_last_lines(failed.stdout, 6))
    assert "--resume" not in tail and "set it to retry" not in failed.stdout, tail
    # issue 70: not a tenth (100, then 10, diverged too before 1 did): the job file's own rate,
    # the --set that raised it dropped; run as printed, it trains
    command = _printed(failed.stdout, "a restart with the same settings repeats this failure: fix "
                       "its cause (above) first; the loss diverged: a new run at the job file's "
                       "own learning rate (1000 -> 0.1):")
    assert command == f"launch {REPO}/jobs/linear.yaml", command
    again = _run_printed(command + f" --run-dir {tmp_path / 'again'}")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_diverged_loss_at_the_job_files_own_rate_gets_a_hundredth_of_it():
    """Issue 70: with no lower rate known (the file's own diverged), a hundredth, the other
    settings kept, not a tenth a run; a rate the --set lowered below the file's is lowered
    again, not raised back to the file's."""
    from launcher.console import nextsteps
    from launcher.run.classes import FailureClass, Verdict

    verdict = Verdict(FailureClass.PROGRAM, 0, "a loss that is no longer a number: loss is inf at "
                      "step 3; lower optimizer.learning_rate or look at the data")
    for overrides, rates, said, command in (
            (("a.b=1",), (1000.0, 1000.0), "a hundredth of the learning rate (1000 -> 10; if that "
             "diverges too, a hundredth again)", "--set a.b=1 --set optimizer.learning_rate=10"),
            (("optimizer.learning_rate=0.01", "a.b=1"), (0.01, 0.1), "a hundredth of the learning "
             "rate (0.01 -> 0.0001; if that diverges too, a hundredth again)",
             "--set a.b=1 --set optimizer.learning_rate=0.0001"),
            (("optimizer.learning_rate=5", "a.b=1"), (5.0, 0.1), "the job file's own learning rate "
             "(5 -> 0.1)", "--set a.b=1")):
        lines = nextsteps.closing("jobs/linear.yaml", "/runs/r1", 1, False, overrides=overrides,
                                  failure=verdict, saved_step=None, rates=rates)
        assert lines[1:] == [f"{nextsteps.FIX_FIRST}; the loss diverged: a new run at {said}:",
                             f"  launch {os.path.abspath('jobs/linear.yaml')} {command}"], lines


@pytest.mark.parametrize("failure_class", ["INFRASTRUCTURE", "STALL", "PREEMPTION", "PROGRAM"])
def test_the_advice_after_a_failure_is_its_classes(failure_class):
    """Every class's side of the advice (issue 71: only the program error's was checked, so
    advice that told a user to fix the code after a node died, or a stall, passed): a failure a
    restart does not repeat is continued from its checkpoint as it is; a program error is fixed
    first."""
    from launcher.console import nextsteps
    from launcher.run.classes import FailureClass, Verdict

    verdict = Verdict(FailureClass[failure_class], 1, "what happened")
    lines = nextsteps.closing("jobs/linear.yaml", "/runs/r1", 1, False, overrides=("a.b=1",),
                              failure=verdict, saved_step=40)
    resume = "  " + nextsteps.resume_command("/runs/r1")  # launch resume /runs/r1
    if failure_class == "PROGRAM":
        assert lines[1:] == [f"{nextsteps.FIX_FIRST}, then continue from the checkpoint of step "
                             "40 (add --set KEY=VALUE to change a setting):", resume], lines
    else:
        assert lines[1:] == ["continue this failed run from its checkpoint of step 40 (its job "
                             "and settings; add --set KEY=VALUE to change one):", resume], lines


@pytest.mark.slow
def test_after_ctrl_c_the_printed_command_pasted_in_another_directory_continues_to_the_end(
        tmp_path):
    """Issue 70's example (at 2,000 steps of its 20,000: the same path, a CI's minute): Ctrl-C
    of `launch jobs/linear.yaml --set train.num_steps=2000`; the continue command it prints,
    pasted into a shell in another directory, continues the run to step 2,000 with the params
    of an uninterrupted run. Nothing is given again: no job path, no --set."""
    import subprocess

    from harness.helpers import env_for_tests
    from harness.runs import assert_same_params, params

    clone, other = tmp_path / "clone", tmp_path / "other"
    shutil.copytree(os.path.join(REPO, "jobs"), clone / "jobs")
    other.mkdir()
    env = env_for_tests(XDG_STATE_HOME=str(tmp_path / "state"))
    proc = subprocess.Popen(["launch", "jobs/linear.yaml", "--set", "train.num_steps=2000"],
                            cwd=str(clone), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    out = Output.of(proc)
    out.wait_for(r"^\[p0\] step ([3-9]\d\d|1\d\d\d)/2000 ", 120)
    proc.send_signal(signal.SIGINT)
    code, text = out.finish(60)
    assert code == 130, text
    agreed = re.search(r"continue this stopped run from its checkpoint of step (\d+) ", text)
    assert agreed and 300 <= int(agreed.group(1)) < 2000, text
    command = _printed(text, "continue this stopped run from its checkpoint of step")
    [run_dir] = [str(d) for d in (clone / "runs" / "linear").iterdir() if d.name[0].isdigit()]
    assert command == f"launch resume {run_dir}", command
    pasted = subprocess.run(command, shell=True, cwd=str(other), env=env, capture_output=True,
                            text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert pasted.returncode == 0, pasted.stdout + pasted.stderr
    assert "(resuming; attempt 1)" in pasted.stdout and "[p0] step 2000/2000 " in pasted.stdout
    assert f"resumed from the checkpoint of step {agreed.group(1)} (attempt 1)" in pasted.stdout
    with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
        record = json.load(f)
    assert (record["state"], record["step"], record["num_steps"]) == ("succeeded", 2000, 2000)
    whole = subprocess.run(["launch", "jobs/linear.yaml", "--set", "train.num_steps=2000",
                            "--run-dir", str(tmp_path / "whole")], cwd=str(clone), env=env,
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert_same_params(params(run_dir), params(str(tmp_path / "whole")))
