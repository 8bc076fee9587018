"""Names that find the run meant, in every command (issue 70, item 4): one resolver
(``launcher.rundir.names.resolve``), ``launch tensorboard`` included; for ``stop``, ``attach``
and ``wait`` a job's name means its live run (several: listed, none chosen); ``why`` its
newest failed run; a typo gets the closest names, and the message says where it looked."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess

import pytest

from harness.helpers import LAUNCH, REPO, Output, env_for_tests
from launcher import proctl
from launcher.commands import tensorboard as tensorboard_command
from launcher.errors import SpecError
from launcher.rundir import index, names


def _run(base, job: str, stamp: str, state: str, **extra):
    run = base / "runs" / job / stamp
    run.mkdir(parents=True)
    (run / "spec.yaml").write_text(f"name: {job}\n")
    record = {"job": job, "state": state, "started": f"2026-12-0{stamp[7]}T09:00:00"}
    if state == "running":  # a live launcher: this test's own process
        record["launcher"] = {"pid": os.getpid(), "host": socket.gethostname(),
                              "since": proctl.start_ticks(os.getpid())}
    record.update(extra)
    (run / "run.json").write_text(json.dumps(record))
    return str(run)


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path


def test_a_job_s_name_means_its_live_run_for_stop_attach_and_wait(here):
    live = _run(here, "linear", "20261201-090000-000", "running")
    ended = _run(here, "linear", "20261202-090000-000", "succeeded")
    assert names.resolve("linear") == ended  # logs, tensorboard: the newest
    (here / "linear").mkdir()  # a folder of the user's named like the job is no run
    assert names.resolve("linear") == ended
    assert names.resolve("linear", prefer=names.LIVE) == live
    second = _run(here, "linear", "20261203-090000-000", "running")
    with pytest.raises(SpecError) as err:  # more than one: listed, none chosen
        names.resolve("linear", prefer=names.LIVE)
    said = str(err.value.problems[0])
    assert "job 'linear' has 2 runs running: linear/20261203-090000-000, " \
           "linear/20261201-090000-000; name one of them" in said, said
    assert names.resolve("linear/20261203-090000-000", prefer=names.LIVE) == second


def test_why_means_the_newest_failed_run(here):
    failed = _run(here, "linear", "20261201-090000-000", "failed")
    _run(here, "linear", "20261202-090000-000", "succeeded")
    assert names.resolve("linear", prefer=names.FAILED) == failed
    restarted = _run(here, "linear", "20261203-090000-000", "succeeded",
                     failures={"preemption": 1})
    assert names.resolve("linear", prefer=names.FAILED) == failed  # a failed run first
    os.rename(os.path.join(failed, "run.json"), os.path.join(failed, "gone.json"))
    assert names.resolve("linear", prefer=names.FAILED) == restarted  # else a failed attempt


def test_no_name_means_the_newest_run_of_any_job_and_for_why_the_newest_failed(here):
    # `launch why` and `launch logs` with no name (a usage error before): every run counts,
    # as a job's name counts its own
    with pytest.raises(SpecError) as err:
        names.resolve(None)
    assert "no runs under " + str(here / "runs") in str(err.value.problems[0])
    failed = _run(here, "digits", "20261201-090000-000", "failed")
    newest = _run(here, "linear", "20261202-090000-000", "succeeded")
    assert names.resolve(None) == newest
    assert names.resolve(None, prefer=names.FAILED) == failed
    (here / "runs" / "digits" / "20261201-090000-000" / "launcher.log").write_text(
        "attempt 0 failed: process_id 1 on localhost exited with code 1 [program error]\n")
    done = subprocess.run(LAUNCH + ["why"], cwd=str(here), capture_output=True, text=True,
                          env=env_for_tests(XDG_STATE_HOME=str(here / "state")), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"launch why: {failed}\nattempt 0 failed: process_id 1"), \
        done.stdout


def test_a_typo_gets_the_closest_names_and_says_where_it_looked(here):
    _run(here, "linear", "20261201-090000-000", "succeeded")
    _run(here, "diabetes", "20261202-090000-000", "succeeded")
    for command in (["stop", "linera"], ["logs", "linera"], ["why", "linera"],
                    ["tensorboard", "linera"]):
        done = subprocess.run(LAUNCH + command, cwd=str(here), env=env_for_tests(
            XDG_STATE_HOME=str(here / "state")), capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (command, done.stderr)
        assert "no run or job 'linera' under " + str(here / "runs") in done.stderr, done.stderr
        assert "or in your index of runs (" + str(here / "state" / "podlaunch" / "runs.index") \
            in done.stderr, done.stderr
        assert "did you mean 'linear'?" in done.stderr, done.stderr
    with pytest.raises(SpecError) as err:
        names.resolve("20261201-09000-000", root=str(here / "runs"))
    said = str(err.value.problems[0])
    assert f"under {here / 'runs'}; did you mean '20261201-090000-000'" in said, said
    assert "index" not in said  # --root: that folder alone


def test_tensorboard_finds_a_job_s_runs_where_the_other_commands_do(here, tmp_path_factory):
    """A run started elsewhere is in the user's index: ``logs``, ``stop`` and ``why`` found
    it by its job's name, ``tensorboard`` did not."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    run = _run(elsewhere, "linear", "20261201-090000-000", "succeeded")
    index.add(run)
    assert names.resolve("linear") == run
    assert tensorboard_command.served_runs("linear")[0] == [run]
    assert tensorboard_command.served_runs(None)[0] == [run]  # the newest run's job
    assert tensorboard_command.served_runs("linear/20261201-090000-000")[0] == [run]
    with pytest.raises(SpecError):  # --root: that folder alone
        tensorboard_command.served_runs("linear", str(here / "runs"))


@pytest.mark.slow
def test_with_two_linear_runs_one_live_one_ended_stop_linear_stops_the_live_one(here):
    """The issue's example: `launch stop linear` answered "has ended; nothing to stop"
    (exit 2) while a linear run trained."""
    env = {"XDG_STATE_HOME": str(here / "state")}
    proc = subprocess.Popen(LAUNCH + [os.path.join(REPO, "jobs", "linear.yaml"), "--set",
                                      "train.num_steps=1000000", "--set", "cluster.num_processes=1"],
                            cwd=str(here), env=env_for_tests(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    out = Output.of(proc)
    try:
        out.wait_for(r"^\[p0\] step \d+/1000000", 120)
        [live] = os.listdir(here / "runs" / "linear")
        ended = _run(here, "linear", "29991231-090000-000", "succeeded",
                     started="2999-12-31T09:00:00")  # the newest
        assert names.resolve("linear") == ended
        stopped = subprocess.run(LAUNCH + ["stop", "linear"], cwd=str(here),
                                 env=env_for_tests(**env), capture_output=True, text=True,
                                 timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert f"stopping the run in {here / 'runs' / 'linear' / live}" in stopped.stdout
        code, _ = out.finish(60)
        assert code == 130
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
