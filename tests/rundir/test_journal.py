"""What a detached run keeps so that a supervisor killed loses nothing, in milliseconds: the
output file read from an offset (``launcher.remote.tail``), the journal's round trip of the
restart budgets, and the ledger's ``unsupervised`` bucket."""

from __future__ import annotations

import json
import os

import pytest

from launcher import owned
from launcher.errors import SpecError
from launcher.remote import tail
from launcher.rundir import journal, ledger
from launcher.run.classes import FailureClass
from launcher.run.classes import Budgets


@pytest.fixture
def user_key(tmp_path, monkeypatch):
    """The user's key (``owned.key``) in a state folder of the test's own."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return owned.key(create=True)


def _sealed(run_dir, data: dict, key: bytes) -> str:
    """A journal's text as the user's own launcher writes it for ``run_dir``."""
    return json.dumps(owned.seal(str(run_dir), data, key))


def test_a_tail_gives_whole_lines_from_an_offset_and_the_last_one_once_its_writer_is_gone(tmp_path):
    path = tmp_path / "process-000.out"
    path.write_bytes(b"one\ntwo\nthr")
    alive = [True]

    def writer_alive():
        if alive[0]:  # the writer finishes the line, then ends
            with open(path, "ab") as f:
                f.write(b"ee\nfour")
            alive[0] = False
        return True if alive[0] else False

    got = list(tail.lines(str(path), 0, writer_alive, poll_s=0))
    assert got == [("one", 4), ("two", 8), ("three", 14), ("four", 18)]
    # from the offset a supervisor kept: what follows it, and nothing before
    assert list(tail.lines(str(path), 8, lambda: False)) == [("three", 14), ("four", 18)]
    os.symlink(path, tmp_path / "link")
    with pytest.raises(OSError):  # never read through a link planted in the run directory
        list(tail.lines(str(tmp_path / "link"), 0, lambda: False))


def test_the_journal_keeps_the_budgets_a_restart_needs(tmp_path, user_key):
    class Policy:
        program_errors, infrastructure, preemptions, stalls, max_restarts, backoff_s = 2, 0, 0, 0, None, 1.0

    budgets = Budgets(Policy())
    budgets.take(FailureClass.PROGRAM)
    kept = journal.Journal(str(tmp_path), "local", ["jobs/linear.yaml"], str(tmp_path),
                           key=user_key, nonce="n")
    kept.state(1, budgets, 1, budgets.count_text(FailureClass.PROGRAM), [])
    kept.write()
    data = journal.read(str(tmp_path))
    again = Budgets(Policy())
    again.restore(data["budgets"])
    assert (again.used, again.total, again.last, again.in_a_row) == \
        (budgets.used, budgets.total, budgets.last, budgets.in_a_row)
    assert data["counted"] == "program error restart 1 of 2" and data["attempt"] == 1
    assert oct(os.stat(tmp_path / journal.JOURNAL_FILE).st_mode & 0o777) == "0o600"
    kept.close()
    with pytest.raises(SpecError, match="only a run started with --detach"):
        journal.read(str(tmp_path))


def test_a_backend_that_cannot_take_processes_back_is_named_by_the_journal(tmp_path, user_key):
    (tmp_path / journal.JOURNAL_FILE).write_text(_sealed(tmp_path, {
        "version": journal.VERSION, "backend": "ssh", "adopts": False, "argv": [], "cwd": "/"},
        user_key))
    with pytest.raises(SpecError, match=r"its backend \(ssh\) could not take a run's processes back"):
        journal.read(str(tmp_path))


def test_a_gap_while_the_processes_trained_counts_its_steps_and_only_an_idle_gap_is_badput():
    """Steps trained while no supervisor watched are productive (issue: 0.42 goodput with
    "no supervisor watching 17.1 s" after a take-back that retrained nothing); the gap's
    length is a fact beside the buckets; a gap before the processes started ran nothing."""
    from launcher.state import Result, Tracked

    class Worker:
        plan = None

    t = Tracked(Worker())
    t.stats.first_step_at, t.stats.progress_at = 10.0, 100.0
    result = Result([t], first_failure=None, interrupted=False, elapsed_s=0.0)
    # taken back twice while training: the steps count
    times = ledger.Times(0.0, started_at=1.0, ended_at=101.0,
                         unsupervised=[(20.0, 30.0), (40.0, 60.0)])
    entry = ledger.attempt_entry(0, times, result, None)
    assert entry["buckets_s"]["unsupervised"] == 0.0
    assert entry["buckets_s"]["productive"] == 90.0
    assert entry["unwatched_s"] == 30.0
    assert entry["wall_s"] == 101.0 == sum(entry["buckets_s"].values())
    # killed while starting the attempt: the gap before its processes started ran nothing
    times = ledger.Times(0.0, started_at=6.0, ended_at=101.0, unsupervised=[(1.0, 5.0)])
    entry = ledger.attempt_entry(0, times, result, None)
    assert entry["buckets_s"]["unsupervised"] == 4.0
    assert entry["buckets_s"]["launch"] == 2.0
    assert entry["buckets_s"]["productive"] == 90.0
    assert entry["wall_s"] == 101.0 == sum(entry["buckets_s"].values())
    run = ledger.totals([entry, ledger.attempt_entry(1, ledger.Times(
        0.0, started_at=1.0, ended_at=101.0, unsupervised=[(20.0, 30.0)]), result, None)])
    assert run["unwatched_s"] == 14.0 and run["largest_badput"] != "unsupervised"
    line = ledger.summary_line(run)
    assert "14.0 s without a supervisor (killed, until taken back): the steps trained " \
        "meanwhile count" in line, line


def _killed_run(tmp_path, state: str = "running"):
    """A run directory whose supervisor is gone (its lock file held by nobody)."""
    from launcher.rundir import runlock

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"job": "linear", "state": state,
                                                  "launcher": {"pid": 1}}))
    (run_dir / "spec.yaml").write_text("name: linear\n")
    (run_dir / runlock.LOCK_FILE).write_text("{}\n")
    return run_dir


@pytest.mark.parametrize("journal_data, said", [
    (None, "only a run started with --detach can be taken back"),
    ({"version": journal.VERSION, "backend": "slurm", "adopts": False, "argv": [], "cwd": "/"},
     r"its backend \(slurm\) could not take a run's processes back"),
])
def test_attach_of_a_killed_run_it_cannot_take_back_refuses_at_once(tmp_path, user_key,
                                                                   journal_data, said):
    from launcher.commands import logs as logs_command

    run_dir = _killed_run(tmp_path)
    if journal_data is not None:
        (run_dir / journal.JOURNAL_FILE).write_text(_sealed(run_dir, journal_data, user_key))
    with pytest.raises(SpecError, match=said):
        logs_command.attach_main([str(run_dir)])


def test_attach_never_takes_back_a_run_whose_state_is_final(tmp_path):
    from launcher.commands import logs as logs_command

    run_dir = _killed_run(tmp_path, "succeeded")
    (run_dir / journal.JOURNAL_FILE).write_text(json.dumps(
        {"version": journal.VERSION, "backend": "local", "adopts": True, "argv": ["x.yaml"]}))
    with pytest.raises(SpecError, match=r"has ended \(state succeeded\)"):
        logs_command.attach_main([str(run_dir)])


def test_the_strays_of_a_start_a_killed_supervisor_left_are_stopped_and_only_they(
        tmp_path, user_key, monkeypatch):
    # a supervisor killed while starting an attempt leaves processes no journal names: the
    # one taking the run back finds them by the run's secret before it starts any; one that
    # names the run's directory without its secret (a copy's, a forged one) is not signalled
    import subprocess
    import sys

    from launcher.backends.local import adopt as localadopt

    run_dir = str(tmp_path / "run")
    secret = owned.run_secret(run_dir, "n", user_key)
    monkeypatch.setenv(owned.SECRET_VAR, secret)
    code = "import time; print('up', flush=True); time.sleep(60)"
    ours = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            env={**os.environ, "PODLAUNCH_RUN_DIR": run_dir})
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             env={**os.environ, "PODLAUNCH_RUN_DIR": run_dir,
                                  owned.SECRET_VAR: owned.run_secret(run_dir + "-2", "n", user_key)})
    try:
        assert ours.stdout.readline() == b"up\n" and other.stdout.readline() == b"up\n"
        assert localadopt.stop_strays(run_dir) == [ours.pid]
        assert ours.wait(timeout=10) == -9 and other.poll() is None
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()


WALL = 1000.0  # the fake wall clock: the fake monotonic one plus this


def _adopting(tmp_path, monkeypatch):
    """A fake monotonic clock, the wall clock WALL ahead of it for the journal's conversions,
    ``restarts.run``'s supervision on that clock, and a session whose one attempt ends cleanly
    1 s after its start."""
    import functools
    import io
    import types

    from harness.fakes import FakeClock, FakeSession, FakeTrainerJob, FakeWorker
    from launcher import spec as specs
    from launcher.run import adopt
    from launcher.console import Console
    from launcher.run import restarts
    from launcher.run import supervise as supervision
    from launcher.ends import Exited

    clock = FakeClock()
    wall = types.SimpleNamespace(time=lambda: clock.now + WALL, monotonic=clock)
    monkeypatch.setattr(journal, "time", wall)
    monkeypatch.setattr(adopt, "time", wall)
    monkeypatch.setattr(restarts, "supervise", functools.partial(
        supervision.supervise, clock=clock, sleep=clock.sleep))
    job = FakeTrainerJob(
        name="fake", num_processes=1, train=types.SimpleNamespace(compilation_cache=True),
        restarts=specs.RestartSpec(backoff_s=4.0, program_errors=1),
        watchdog=types.SimpleNamespace(stall_timeout_s=None, first_step_timeout_s=None),
        cluster=types.SimpleNamespace(grace_s=1.0),
        checkpoint=types.SimpleNamespace(notice_grace_s=25.0))

    def start(plan):
        clock.sleep(0.25)
        return [FakeWorker(clock, p, lines=[(clock.now + 0.9, "done")], exit=Exited(0),
                           exit_at=clock.now + 1.0) for p in plan.processes]

    console = Console(io.StringIO(), tty=False, status_every_s=0)
    return clock, FakeSession(job, str(tmp_path), [start], console), console


@pytest.mark.parametrize("killed_in_the_wait", [1, 2])
def test_a_wait_taken_back_counts_every_second_once_in_the_ledger_as_in_the_duration(
        tmp_path, monkeypatch, killed_in_the_wait):
    # The CI failure's story in fake time: a launch at 0 (wall WALL) whose attempt 0 failed at
    # 10 and waits 4 s for its restart; its supervisor was last seen at 10.1. A launch that
    # takes it back starts at 11.0, reads its clock at 11.2 (its start-up) and starts its
    # record and journal by 11.3. Its ledger (ledger.json's entry of attempt 0, then its own
    # attempt) must add up to run.json's duration: from the killed launch's start to the end.
    from launcher.run import adopt
    from launcher.rundir import record as records
    from launcher.run import restarts

    clock, session, console = _adopting(tmp_path, monkeypatch)
    failed = ledger.attempt_entry(0, ledger.Times(0.0), None, None)  # 0 to 10: its own time
    failed["buckets_s"]["launch"] = failed["wall_s"] = 10.0
    data = {"attempt": 0, "restarts": 1, "counted": "program error restart 1 of 1",
            "budgets": {}, "entries": [failed], "alive_at": WALL + 10.1,
            "waiting": {"since": WALL + 10.0, "until": WALL + 14.0},
            "launched": {"wall": WALL, "before_s": 0.0}}

    def take_back(started_at: float, now: float):
        clock.now = started_at
        clock.sleep(now - started_at)  # the adopting launch's start-up, before its clock's reading
        adopted = adopt.take_back(session, session.plan(), data, console, str(tmp_path), clock=clock)
        record = records.Record(str(tmp_path), "fake", 30, clock=clock, launched_at=started_at)
        clock.sleep(0.1)  # its record and journal
        adopt.continue_record(record, data)
        return adopted, record

    adopted, record = take_back(11.0, 11.2)
    if killed_in_the_wait == 2:  # killed in the same wait, at 11.3; taken back at 15.0
        data.update(entries=[], alive_at=WALL + 11.3)
        adopted, record = take_back(14.8, 15.0)
    result, attempts = restarts.run(session, session.plan(), console, restarts.Begin(
        began_at=clock.now, sleep=clock.sleep, clock=clock, adopted=adopted))
    assert result.exit_code == 0
    end = clock.now
    record.end("succeeded", result, attempts)
    entries = ledger.add_attempts(ledger.read(str(tmp_path)), attempts)
    run = ledger.totals(entries)
    duration = json.loads((tmp_path / "run.json").read_text())["duration_s"]
    assert run["wall_s"] == pytest.approx(end, abs=0.002) == duration
    wait = entries[0]["buckets_s"]
    if killed_in_the_wait == 1:  # 10.1 to 11.2 unwatched; the wait's rest to 14 watched
        assert attempts[0].times.began_at == pytest.approx(14.0)
        assert (wait["unsupervised"], wait["restart_wait"]) == pytest.approx((1.1, 2.9))
    else:  # 10.1 to 11.2 and 11.3 to 15.0 unwatched; the next attempt begins at once
        assert attempts[0].times.began_at == pytest.approx(15.0)
        assert (wait["unsupervised"], wait["restart_wait"]) == pytest.approx((4.8, 0.2))
    assert entries[0]["wall_s"] == pytest.approx(attempts[0].times.began_at)


def test_a_taken_back_launchs_duration_counts_from_the_killed_launchs_start_once(tmp_path,
                                                                                 monkeypatch):
    # the mid-run kill: the ledger's adopted attempt begins at the killed launch's start (0),
    # and so does run.json's duration, however long the adopting launch took to start
    from launcher.run import adopt
    from launcher.rundir import record as records

    clock, _, _ = _adopting(tmp_path, monkeypatch)
    clock.sleep(11.0)
    record = records.Record(str(tmp_path), "fake", 30, clock=clock, launched_at=10.0)
    adopt.continue_record(record, {"launched": {"wall": WALL, "before_s": 5.0}})
    clock.sleep(9.0)
    record.end("succeeded")
    assert json.loads((tmp_path / "run.json").read_text())["duration_s"] == 5.0 + 20.0


def test_a_take_back_killed_within_a_second_leaves_each_log_its_size_at_the_offset(tmp_path,
                                                                                   user_key):
    """Issue 71: after two quick take-backs a process's own log held step lines twice. The
    journal written as an attempt's processes start (or are taken back) names each log's size
    with its offset, not only at the next flush a second later: the next take-back cuts the
    log there and reads again only what follows."""
    log = tmp_path / "logs" / "process-000.log"
    log.parent.mkdir()
    log.write_text("2026-12-01T10:00:00.000Z step 5/100\n")  # what was logged up to the offset

    class Worker:
        plan = type("Plan", (), {"log_path": str(log)})()
        read_to = 120

        def journal_entry(self) -> dict:
            return {"pid": 1}

    kept = journal.Journal(str(tmp_path), "local", ["jobs/linear.yaml"], str(tmp_path),
                           key=user_key, nonce="n")
    kept.started(ledger.Times(0.0, started_at=1.0), [Worker()])
    [entry] = journal.read(str(tmp_path))["workers"]
    assert entry == {"pid": 1, "offset": 120, "logged": log.stat().st_size}
    kept.close()
