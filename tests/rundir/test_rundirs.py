"""Run directories: default ones are made exclusively (issue 25, item 2): two launches of one
job in the same millisecond (a sweep) each get their own, and a dry run makes none; a run
whose disk fills ends with its cause and a true run.json (item 11); a new holder of a run
directory's lock replaces the record a stale one left."""

from __future__ import annotations

import datetime
import json
import os
import re

import pytest

from launcher import backends
from launcher.run import starts
from launcher.rundir import runlock
from launcher import spec as specs
from harness.helpers import REPO, fill, full_disk_ready, launched


class _Frozen(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2026, 12, 1, 12, 0, 0, 123000)


def test_two_launches_in_one_millisecond_get_two_run_directories(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(starts.datetime, "datetime", _Frozen)
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), None, (), registry=backends)
    named = starts.run_dir_for(job, None)  # a dry run: named, not made
    assert not os.path.exists(named)
    first = starts.run_dir_for(job, None, create=True)
    second = starts.run_dir_for(job, None, create=True)
    assert first == named and second == named + "-2"
    assert os.path.isdir(first) and os.path.isdir(second)
    assert oct(os.stat(first).st_mode & 0o777) == "0o700"


@pytest.mark.slow
def test_a_disk_that_fills_during_a_save_ends_the_run_with_its_cause_and_a_true_record(tmp_path):
    # issue 25, item 11: a real full filesystem (a tmpfs, filled while the run steps): the
    # failure names the full disk (not a raw traceback), the launcher keeps reading the
    # workers though their logs cannot grow, and run.json says the run failed.
    with full_disk_ready(tmp_path / "disk", "32m") as disk:
        run_dir = disk / "run"
        with launched("jobs/linear.yaml", "--run-dir", str(run_dir),
                      "--set", "train.num_steps=1000000", "--set", "checkpoint.every_steps=50",
                      "--set", "logging.log_every_steps=50") as out:
            out.wait_for(r"^\[p0\] step \d+/", 120)
            fill(disk / "filler")
            code, text = out.finish(120)
        assert code == 1, text[-3000:]
        # the save or the TensorBoard writer, whichever met the full disk first
        summary = text[text.index("FAILED: process_id"):]
        assert re.search(r"\| worker: the disk is full \(No space left on device\) writing (into )?\S+: "
                         r"free space there", summary), text[-3000:]
        record = json.loads((run_dir / "run.json").read_text())
        assert record["state"] == "failed"
        # issue 51.2: the worker's explanation decides: a full disk is no program error to retry
        assert record["last_failure"]["class"] == "final", record["last_failure"]
        assert "program errors" not in text[text.index("attempt 0 failed"):], text[-3000:]
        assert "Traceback" not in text  # issue 50, item 4: the sentence, not the traceback
        assert not list((run_dir / "checkpoints").glob(".tmp-step-*"))  # the half-save is gone


def test_a_new_lock_holder_replaces_the_whole_record_a_longer_stale_one_left(tmp_path):
    """The lock file of a launcher that ended keeps its record, here a longer one (a long
    command line): the next holder's record replaces it whole, so what a refused launcher reads
    of the holder (``runlock.holder``) is the new holder's, not a record with the old one's
    tail after it (which reads as no holder at all)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    stale = {"pid": 1, "host": "elsewhere", "started": 1.0, "command": "launch " + "x" * 400}
    (run_dir / runlock.LOCK_FILE).write_text(json.dumps(stale) + "\n")
    lock = runlock.acquire(str(run_dir), "--resume")
    try:
        text = (run_dir / runlock.LOCK_FILE).read_text()
        assert text.count("\n") == 1 and "elsewhere" not in text
        assert runlock.holder(str(run_dir / runlock.LOCK_FILE))["pid"] == os.getpid()
    finally:
        lock.release()


def test_an_index_of_runs_past_its_bound_keeps_the_newest_runs(tmp_path, monkeypatch):
    """The user's index of runs is rewritten once past ``index.KEEP`` lines: the newest runs
    stay, the oldest go (issue 71: a rewrite that kept the oldest passed every test, none of
    which reached the bound)."""
    from launcher.rundir import index

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    made = []
    for n in range(index.KEEP + 30):
        run = tmp_path / "runs" / f"r{n:05d}"
        run.mkdir(parents=True)
        (run / "spec.yaml").write_text("name: linear\n")
        made.append(os.path.realpath(run))
        index.add(str(run))
    assert index.runs() == made  # every run is found; the index is rewritten after the read
    with open(index.path(), encoding="utf-8") as f:
        assert f.read().splitlines() == made[-index.KEEP:]
    assert index.runs() == made[-index.KEEP:]
