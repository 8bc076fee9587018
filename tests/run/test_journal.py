"""What a detached run keeps so that a supervisor killed loses nothing, in milliseconds: the
output file read from an offset (``launcher.remote.tail``), the journal's round trip of the
restart budgets, and the ledger's ``unsupervised`` bucket."""

from __future__ import annotations

import json
import os

import pytest

from launcher.errors import SpecError
from launcher.remote import tail
from launcher.run import journal, ledger
from launcher.run.classes import FailureClass
from launcher.run.restarts import Budgets


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


def test_the_journal_keeps_the_budgets_a_restart_needs(tmp_path):
    class Policy:
        program_errors, infrastructure, preemptions, stalls, max_restarts, backoff_s = 2, 0, 0, 0, None, 1.0

    budgets = Budgets(Policy())
    budgets.take(FailureClass.PROGRAM)
    kept = journal.Journal(str(tmp_path), "local", ["jobs/linear.yaml"], str(tmp_path))
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


def test_a_backend_that_cannot_take_processes_back_is_named_by_the_journal(tmp_path):
    (tmp_path / journal.JOURNAL_FILE).write_text(json.dumps(
        {"version": journal.VERSION, "backend": "ssh", "adopts": False, "argv": []}))
    with pytest.raises(SpecError, match="built for the local backend only, not yet for ssh"):
        journal.read(str(tmp_path))


def test_the_unsupervised_gap_is_its_own_bucket_and_the_buckets_still_add_up():
    from launcher.state import Result, Tracked

    class Worker:
        plan = None

    t = Tracked(Worker())
    t.stats.first_step_at, t.stats.progress_at = 10.0, 100.0
    result = Result([t], first_failure=None, interrupted=False, elapsed_s=0.0)
    # taken back twice: each gap is the bucket's
    times = ledger.Times(0.0, started_at=1.0, ended_at=101.0,
                         unsupervised=[(20.0, 30.0), (40.0, 60.0)])
    entry = ledger.attempt_entry(0, times, result, None)
    assert entry["buckets_s"]["unsupervised"] == 30.0
    assert entry["buckets_s"]["productive"] == 60.0
    assert entry["wall_s"] == 101.0 == sum(entry["buckets_s"].values())


def _killed_run(tmp_path, state: str = "running"):
    """A run directory whose supervisor is gone (its lock file held by nobody)."""
    from launcher import runlock

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"job": "linear", "state": state,
                                                  "launcher": {"pid": 1}}))
    (run_dir / "spec.yaml").write_text("name: linear\n")
    (run_dir / runlock.LOCK_FILE).write_text("{}\n")
    return run_dir


@pytest.mark.parametrize("journal_text, said", [
    (None, "only a run started with --detach can be taken back"),
    (json.dumps({"version": journal.VERSION, "backend": "slurm", "adopts": False, "argv": []}),
     "built for the local backend only, not yet for slurm"),
])
def test_attach_of_a_killed_run_it_cannot_take_back_refuses_at_once(tmp_path, journal_text, said):
    from launcher.commands import logs as logs_command

    run_dir = _killed_run(tmp_path)
    if journal_text is not None:
        (run_dir / journal.JOURNAL_FILE).write_text(journal_text)
    with pytest.raises(SpecError, match=said):
        logs_command.attach_main([str(run_dir)])


def test_attach_never_takes_back_a_run_whose_state_is_final(tmp_path):
    from launcher.commands import logs as logs_command

    run_dir = _killed_run(tmp_path, "succeeded")
    (run_dir / journal.JOURNAL_FILE).write_text(json.dumps(
        {"version": journal.VERSION, "backend": "local", "adopts": True, "argv": ["x.yaml"]}))
    with pytest.raises(SpecError, match=r"has ended \(state succeeded\)"):
        logs_command.attach_main([str(run_dir)])


def test_the_strays_of_a_start_a_killed_supervisor_left_are_stopped_and_only_they(tmp_path):
    # a supervisor killed while starting an attempt leaves processes no journal names: the
    # one taking the run back finds them by their run directory before it starts any
    import subprocess
    import sys

    from launcher.backends import localadopt

    run_dir = str(tmp_path / "run")
    code = "import time; print('up', flush=True); time.sleep(60)"
    ours = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            env={**os.environ, "PODLAUNCH_RUN_DIR": run_dir})
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             env={**os.environ, "PODLAUNCH_RUN_DIR": run_dir + "-2"})
    try:
        assert ours.stdout.readline() == b"up\n" and other.stdout.readline() == b"up\n"
        assert localadopt.stop_strays(run_dir) == [ours.pid]
        assert ours.wait(timeout=10) == -9 and other.poll() is None
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()
