"""``launch COMMAND``: one table (``launcher.commands.COMMANDS``) that ``--help`` lists and the
CLI dispatches on; a job file still needs no command word; a mistyped command is bad input."""

from __future__ import annotations

import subprocess

import pytest

from harness.helpers import LAUNCH, REPO, env_for_tests
from launcher import commands


def _launch(*args, cwd=REPO):
    return subprocess.run(LAUNCH + list(args), cwd=cwd, env=env_for_tests(), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_help_lists_every_command_of_the_table_once():
    shown = _launch("--help")
    assert shown.returncode == 0, shown.stderr
    listed = [line.split()[1] for line in shown.stdout.split("commands (", 1)[1].splitlines()[1:]
              if line.startswith("  ") and not line.startswith("      ")]
    assert listed == list(commands.COMMANDS)
    for name in commands.COMMANDS:  # each answers its own --help
        own = _launch(name, "--help")
        assert own.returncode == 0 and f"launch {name}" in own.stdout, (name, own.stderr)


def test_a_mistyped_command_gets_a_did_you_mean_and_exit_2(tmp_path):
    typo = _launch("rnus", cwd=str(tmp_path))
    assert typo.returncode == 2, typo.stderr
    assert "did you mean `launch runs`?" in typo.stderr and "Traceback" not in typo.stderr
    assert "did you mean `launch stop`" in _launch("stpo", cwd=str(tmp_path)).stderr
    # a job file is a job, whatever its name resembles
    (tmp_path / "stpo").write_text("name: x\n")
    as_job = _launch("stpo", cwd=str(tmp_path))
    assert as_job.returncode == 2 and "did you mean" not in as_job.stderr, as_job.stderr
    missing = _launch("rnus.yaml", cwd=str(tmp_path))
    assert missing.returncode == 2 and "rnus.yaml" in missing.stderr
    assert "did you mean" not in missing.stderr


def test_the_main_command_needs_no_command_word():
    plan = _launch("jobs/linear.yaml", "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "process_id" in plan.stdout or "p0" in plan.stdout, plan.stdout[-2000:]


def test_a_reader_that_closes_the_pipe_ends_logs_and_runs_quietly(tmp_path):
    """A newcomer's report: ``launch logs RUN | head -1`` and ``launch runs | head -1`` ended
    with a BrokenPipeError traceback. Now: no traceback, exit 141 (a shell's SIGPIPE code).
    Each output is larger than a pipe holds, so the write after ``head`` leaves fails."""
    import json

    root = tmp_path / "runs"
    for i in range(1500):
        run = root / "linear" / f"20261201-09{i // 100:02d}{i % 100:02d}-000"
        run.mkdir(parents=True)
        (run / "spec.yaml").write_text("name: linear\n")
        (run / "run.json").write_text(json.dumps({"job": "linear", "state": "succeeded",
                                                  "started": f"2026-12-01T09:{i % 60:02d}:00"}))
    (run / "launcher.log").write_text("".join(f"podlaunch: line {n}\n" for n in range(50000)))
    for argv in (["logs", str(run)], ["runs", "--root", str(root), "-n", "0"]):
        proc = subprocess.Popen(LAUNCH + argv, cwd=str(tmp_path), env=env_for_tests(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = proc.stdout.readline()
        proc.stdout.close()  # what head does after its line
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 141 and first, (argv, first, err)
        assert "Traceback" not in err and "BrokenPipe" not in err, (argv, err)
    # a reader gone before anything was written (`launch --version | true`)
    import os as system

    read, write = system.pipe()
    system.close(read)
    with system.fdopen(write, "w") as closed:
        done = subprocess.run(LAUNCH + ["--version"], cwd=str(tmp_path), env=env_for_tests(),
                              stdout=closed, stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 141 and "Traceback" not in done.stderr, done.stderr


def test_wait_and_stop_say_attach_only_for_a_detached_run_whose_supervisor_is_gone(tmp_path):
    """A newcomer's report: a foreground run's launcher SIGKILLed, ``launch wait`` and ``launch
    stop`` said `launch attach RUN` takes its processes back, and attach refused (only a
    detached run can be taken back). Now each says what applies to the run: attach for a
    detached one (its journal), ``--resume`` for one started in the foreground."""
    import json
    import os

    run = tmp_path / "runs" / "linear" / "r1"
    run.mkdir(parents=True)
    (run / "spec.yaml").write_text("name: linear\n")
    (run / "run.json").write_text(json.dumps({"job": "linear", "state": "running",
                                              "launcher": {"pid": 999999999, "host": os.uname().nodename}}))
    for detached in (False, True):
        if detached:
            (run / "supervisor.json").write_text("{}")
        waited = subprocess.run(LAUNCH + ["wait", str(run)], cwd=str(tmp_path), env=env_for_tests(),
                                capture_output=True, text=True, timeout=60)
        stopped = subprocess.run(LAUNCH + ["stop", str(run)], cwd=str(tmp_path), env=env_for_tests(),
                                 capture_output=True, text=True, timeout=60)
        assert waited.returncode == 1 and stopped.returncode == 2, (waited, stopped)
        if detached:  # a stop takes a detached run back to stop it: never from this journal,
            # which no launcher of the user's sealed (tests/commands/test_stop_killed.py)
            assert "is not trusted" in stopped.stderr, stopped.stderr
        for said in (waited.stdout,) + (() if detached else (stopped.stderr,)):
            if detached:
                assert f"`launch attach {run}` takes them back" in said, said
            else:
                assert "started without --detach" in said and "launch attach" not in said, said
                assert f"`launch resume {run}` continues it" in said, said


def test_a_job_s_name_names_its_newest_run(tmp_path):
    """A newcomer's report: `launch runs linear` and `launch tensorboard linear` took the job's
    name, `launch logs linear` refused it. RUN may now be a job's name: its newest run."""
    import json

    for stamp, state in (("20261201-090000-000", "succeeded"), ("20261202-090000-000", "failed")):
        run = tmp_path / "runs" / "linear" / stamp
        run.mkdir(parents=True)
        (run / "spec.yaml").write_text("name: linear\n")
        (run / "run.json").write_text(json.dumps({"job": "linear", "state": state,
                                                  "started": stamp[:4] + "-12-0" + stamp[7]}))
        (run / "launcher.log").write_text(f"podlaunch: the {state} one\n")
    # an index of runs of its own: a job's name also finds the runs the user started anywhere
    # (the suite's shared index holds other tests' newer linear runs)
    (tmp_path / "state").mkdir(mode=0o700)
    env = env_for_tests(XDG_STATE_HOME=str(tmp_path / "state"))
    logs = subprocess.run(LAUNCH + ["logs", "linear"], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=60)
    assert logs.returncode == 0 and logs.stdout == "podlaunch: the failed one\n", logs
    waited = subprocess.run(LAUNCH + ["wait", "linear"], cwd=str(tmp_path), env=env,
                            capture_output=True, text=True, timeout=60)
    assert waited.returncode == 1, waited  # the newest, failed


def test_a_name_that_is_both_a_run_and_a_job_is_refused_naming_both(tmp_path):
    """A tester's report: a job named like a run (det1) made `launch logs det1` take the run
    without a word, while `launch tensorboard det1` took the job."""
    import json

    for job, stamp in (("linear", "det1"), ("det1", "20261201-090000-000")):
        run = tmp_path / "runs" / job / stamp
        run.mkdir(parents=True)
        (run / "spec.yaml").write_text(f"name: {job}\n")
        (run / "run.json").write_text(json.dumps({"job": job, "state": "succeeded"}))
    logs = subprocess.run(LAUNCH + ["logs", "det1"], cwd=str(tmp_path), env=env_for_tests(),
                          capture_output=True, text=True, timeout=60)
    assert logs.returncode == 2, logs
    assert "'det1' names a run (" in logs.stderr and "and a job whose newest run is" in logs.stderr
    whole = subprocess.run(LAUNCH + ["wait", str(tmp_path / "runs" / "linear" / "det1")],
                           cwd=str(tmp_path), env=env_for_tests(), capture_output=True, text=True,
                           timeout=60)
    assert whole.returncode == 0, whole  # its directory: no doubt


def test_resume_continues_from_the_job_and_settings_the_run_recorded_from_any_directory(tmp_path):
    """Issue 70, item 1: a continue command had the job path relative to the clone (typed
    elsewhere: `cannot read`), every --set to repeat, and `launch --resume RUN` alone was
    refused though the run directory holds the job. A dry run started in the clone, then
    `launch resume RUN` and `launch --resume RUN` from another directory, with a --set on top."""
    import json
    import os

    state, elsewhere = tmp_path / "state", tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = env_for_tests(XDG_STATE_HOME=str(state))
    run = tmp_path / "run"
    first = subprocess.run(LAUNCH + ["jobs/linear.yaml", "--set", "train.num_steps=3",
                                     "--set", "cluster.env.HF_TOKEN=pw-rec-1", "--run-dir", str(run),
                                     "--set", "cluster.num_processes=1"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    recorded = json.loads((run / "launch.json").read_text())
    assert recorded == {"job": os.path.join(REPO, "jobs", "linear.yaml"), "cluster": None,
                        "overrides": ["train.num_steps=3", "cluster.env.HF_TOKEN=pw-rec-1",
                                      "cluster.num_processes=1"]}
    assert (run / "launch.json").stat().st_mode & 0o777 == 0o600  # a secret may be in it
    for argv in (["resume", "run", "--dry-run"], ["--resume", "run", "--dry-run"],
                 ["resume", str(run), "--dry-run", "--set", "train.num_steps=6"]):
        done = subprocess.run(LAUNCH + argv, cwd=str(tmp_path if "run" in argv else elsewhere),
                              env=env, capture_output=True, text=True, timeout=120)
        said = done.stdout + done.stderr
        assert done.returncode == 0, said
        assert "pw-rec-1" not in said and "HF_TOKEN='****'" in said, said  # recorded, masked
        assert f"podlaunch: continuing {run} with the job and settings it recorded: " \
            f"{os.path.join(REPO, 'jobs', 'linear.yaml')} --set train.num_steps=3 " in said, said
        assert "process_id 0" in said and "process_id 1" not in said  # num_processes=1, as recorded
    assert said.rstrip().count("--set train.num_steps=3 ") == 1 and \
        "--set cluster.num_processes=1 --set train.num_steps=6" in said, said  # on top
    lower = subprocess.run(LAUNCH + ["resume", str(run), "--set", "train.num_steps=2"],
                           cwd=str(elsewhere), env=env, capture_output=True, text=True, timeout=60)
    assert lower.returncode == 2 and "below step 3, the run's newest checkpoint" in lower.stderr
    missing = subprocess.run(LAUNCH + ["--dry-run"], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 2 and "JOB.yaml (or --resume RUN)" in missing.stderr
    (run / "launch.json").unlink()  # a run from before: said, with what to give instead
    old = subprocess.run(LAUNCH + ["resume", str(run)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert old.returncode == 2 and "no launch.json" in old.stderr and \
        f"launch JOB.yaml [--set KEY=VALUE ...] --resume {run}" in old.stderr, old.stderr


def test_a_run_started_in_another_directory_is_listed_and_named_from_anywhere(tmp_path):
    """A newcomer's report: runs and their names resolved only under ./runs of the current
    directory. The user's index of runs (pointers only) finds a run from anywhere; --root
    still means that folder alone; a lost index loses no run."""
    import json
    import os
    import subprocess

    state, here, there = tmp_path / "state", tmp_path / "here", tmp_path / "there"
    for folder in (state, here, there):
        folder.mkdir(mode=0o700)
    env = env_for_tests(XDG_STATE_HOME=str(state), JAX_PLATFORMS="cpu", COLUMNS="400")  # the run dir column too
    job = os.path.join(REPO, "jobs", "linear.yaml")

    def launch(*args, cwd):
        return subprocess.run(LAUNCH + list(args), cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=300, stdin=subprocess.DEVNULL)

    done = launch(job, "--set", "train.num_steps=2", "--set", "cluster.num_processes=1", cwd=here)
    assert done.returncode == 0, done.stdout + done.stderr
    [run_dir] = list((here / "runs" / "linear").iterdir())
    listed = launch("runs", cwd=there)
    assert listed.returncode == 0 and str(run_dir) in listed.stdout, listed.stdout + listed.stderr
    for name in ("linear", f"linear/{run_dir.name}", run_dir.name):
        for command in (["logs"], ["wait", "--timeout", "5"]):
            shown = launch(*command, name, cwd=there)
            assert shown.returncode == 0, (command, name, shown.stdout + shown.stderr)
    assert "OK: 1 process succeeded" in launch("logs", "linear", cwd=there).stdout
    alone = launch("runs", "--root", str(there / "runs"), cwd=there)  # that folder alone
    assert str(run_dir) not in alone.stdout
    (state / "podlaunch" / "runs.index").unlink()  # lost: found where it is looked for again
    assert str(run_dir) not in launch("runs", cwd=there).stdout
    assert "linear" in launch("runs", cwd=here).stdout
    assert str(run_dir) in launch("runs", cwd=there).stdout
    assert json.loads((run_dir / "run.json").read_text())["state"] == "succeeded"


@pytest.mark.parametrize("argv", [["wait", "r", "--timeout-s", "-3"], ["wait", "r", "--timeout", "nan"],
                                  ["wait", "r", "--timeout-s", "inf"], ["stop", "r", "--timeout", "-5"],
                                  ["stop", "r", "--timeout-s", "0"], ["stacks", "r", "--timeout-s", "0"],
                                  ["profile", "r", "--timeout-s", "-1"]])
def test_a_timeout_that_is_no_number_of_seconds_is_bad_input(argv):
    """Every command's timeout is ``--timeout-s`` (issue 70: stop and wait said ``--timeout``,
    stacks and profile ``--timeout-s``); stop's and wait's former ``--timeout`` still works."""
    done = subprocess.run(LAUNCH + argv, cwd=REPO, env=env_for_tests(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"error: --timeout-s: expected a number of seconds > 0, got {argv[-1]}" in done.stderr


@pytest.mark.slow
def test_launch_why_says_why_each_failed_attempt_failed(tmp_path):
    # "why did attempt N fail" had no command: launch runs shows the class only
    from harness.helpers import launch

    run_dir = tmp_path / "run"
    done = launch("jobs/linear.yaml", "--set", "train.num_steps=20", "--set",
                  "cluster.devices_per_process=1", "--set", "logging.log_every_steps=5",
                  "--set", "task.name=faulty_task:make", "--set", "task.args.crash_at_step=7",
                  "--set", "task.args.crash_process_id=1", "--run-dir", str(run_dir))
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr
    why = launch("why", str(run_dir))
    assert why.returncode == 0, why.stdout + why.stderr
    lines = why.stdout.splitlines()
    assert lines[0].startswith("attempt 0 failed: process_id 1 on localhost exited with code 1: "
                               "a Python error in the job [program error]"), why.stdout
    assert lines[1] == f"  last lines of {run_dir / 'logs' / 'process-001.log'}:", why.stdout
    assert "  | RuntimeError: injected failure at step 7" in lines, why.stdout
    refused = launch("why", str(run_dir), "--attempt", "3")
    assert refused.returncode == 2 and "attempt 3 of the run in" in refused.stderr \
        and "did not fail (failed attempts: 0)" in refused.stderr, refused.stderr
