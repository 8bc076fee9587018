"""A process list a user can read (issue 50, item 5): during a real run no command line of
podlaunch's is over 500 characters (the wrapper once carried its whole source, 24,891
characters), and each worker's names its job, run and process id."""

from __future__ import annotations

import os

import pytest

from harness.helpers import launched, long_job

LONGEST = 500


def _cmdline(pid: int) -> list:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [part.decode(errors="replace") for part in f.read().split(b"\0")[:-1]]


def descendants(pid: int) -> list:
    """Live pids under ``pid`` (children, theirs, ...), read from /proc."""
    children: dict = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != b"Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def command_lines(pids) -> dict:
    lines = {}
    for pid in pids:
        try:
            lines[pid] = _cmdline(pid)
        except OSError:  # gone meanwhile
            continue
    return lines


@pytest.mark.slow
def test_a_run_s_process_list_is_short_and_names_each_worker(tmp_path):
    run_dir = tmp_path / "run"
    with launched(*long_job("trainer", tmp_path), "--run-dir", str(run_dir)) as out:
        out.wait_for(r"^\[p0\] step 40/", 120)
        launcher = out.proc.pid
        table = command_lines([launcher, *descendants(launcher)])
        out.proc.terminate()
        out.finish(60)
    assert len(table) >= 5, table  # the launcher, 2 wrappers, 2 workers
    too_long = {pid: len(" ".join(argv)) for pid, argv in table.items()
                if len(" ".join(argv)) > LONGEST}
    assert not too_long, (too_long, {pid: " ".join(table[pid])[:300] for pid in too_long})
    workers = sorted(" ".join(argv[1:]) for argv in table.values() if "worker" in argv[1:4])
    assert workers == [f"-P -m worker --job linear --run run --process-id {i}" for i in (0, 1)], table
