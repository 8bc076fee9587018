"""Default run directories are made exclusively (issue 25, item 2): two launches of one job
in the same millisecond (a sweep) each get their own, and a dry run makes none."""

from __future__ import annotations

import datetime
import os

from launcher import cli
from launcher import spec as specs
from helpers import REPO


class _Frozen(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2026, 12, 1, 12, 0, 0, 123000)


def test_two_launches_in_one_millisecond_get_two_run_directories(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli.datetime, "datetime", _Frozen)
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), None, ())
    named = cli._run_dir(job, None)  # a dry run: named, not made
    assert not os.path.exists(named)
    first = cli._run_dir(job, None, create=True)
    second = cli._run_dir(job, None, create=True)
    assert first == named and second == named + "-2"
    assert os.path.isdir(first) and os.path.isdir(second)
    assert oct(os.stat(first).st_mode & 0o777) == "0o700"
