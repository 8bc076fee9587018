"""The worker's explanation of its end (worker.contract.causes), without JAX: the line it prints and
the launcher reads back, and a program's full disk explained like the trainer's (51.2)."""

from __future__ import annotations

import errno
import subprocess
import sys

import pytest

from harness.helpers import REPO
from worker.contract import causes


def test_the_line_reads_back_and_only_a_known_cause_counts():
    said = causes.line(causes.DATA, "data error: d.npy: row 3 (0-based), column 1: nan")
    assert causes.said(["step 1/9", said, "other"]) == (causes.DATA, "data error: d.npy: row 3 "
                                                        "(0-based), column 1: nan")
    assert causes.said(["worker: something [retry-me]", "worker: x [data] trailing"]) is None
    with pytest.raises(ValueError, match="expected one of"):
        causes.line("oops", "x")


def test_a_full_disk_or_quota_is_explained_with_what_to_do_and_nothing_else_is():
    full = causes.disk_full(OSError(errno.ENOSPC, "No space left on device", "/r/ckpt"))
    assert full == ("the disk is full (No space left on device) writing /r/ckpt: free space "
                    "there (df shows it), or lower checkpoint.keep, then continue with launch "
                    "--resume RUN_DIR")
    assert causes.disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"), "/r").startswith(
        "the disk is full (Disk quota exceeded) writing into /r:")
    assert causes.disk_full(OSError(errno.EACCES, "Permission denied", "/r")) is None


def test_a_programs_uncaught_full_disk_is_explained_as_the_trainers_is():
    code = ("import errno; from worker import program; "
            "program._on_uncaught(OSError, OSError(errno.ENOSPC, 'No space left on device', "
            "'/r/ckpt'), None)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert causes.said(lines) == (causes.DISK_FULL, causes.disk_full(
        OSError(errno.ENOSPC, "No space left on device", "/r/ckpt"))), lines
