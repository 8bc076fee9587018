"""The modes of the files that may hold a job's secrets, without JAX or sshd (issue 51.9:
only the slow tests checked them): each is made owner-only whatever the umask."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys

import pytest

from launcher.console import Console
from launcher.remote import wrapper
from launcher.rundir import runlock
from launcher.run import logfile
from launcher import remote
from worker.contract import runfiles


@pytest.fixture
def open_umask():
    """The most permissive umask: a mode that relies on the umask shows."""
    before = os.umask(0)
    yield
    os.umask(before)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_run_directory_files_are_owner_only_under_any_umask(tmp_path, open_umask):
    runfiles.write_whole(str(tmp_path / "run.json"), "{}")
    with open(tmp_path / "job.json", "w", opener=runfiles.opener) as f:
        f.write("{}")
    log = logfile.LogFile(str(tmp_path / "process-000.log"), say=lambda text: None)
    log.write("API_TOKEN=s3cr3t\n")
    log.file.close()
    console = Console(io.StringIO(), tty=False, status_every_s=0)
    console.log_to(str(tmp_path / "launcher.log"))
    console.say("hello")
    console.close()
    lock = runlock.acquire(str(tmp_path), "launch")
    try:
        for name in ("run.json", "job.json", "process-000.log", "launcher.log", runlock.LOCK_FILE):
            assert mode(tmp_path / name) == 0o600, (name, oct(mode(tmp_path / name)))
    finally:
        lock.release()


def test_what_a_worker_writes_under_its_wrapper_is_owner_only(tmp_path, open_umask):
    # the shipped wrapper sets umask 077 for its worker: a checkpoint, a metrics file
    made = tmp_path / "run" / "params.npz"
    code = ("import os; os.makedirs('run', exist_ok=True); "
            f"open({str(made)!r}, 'w').write('secret'); os.mkdir('run/sub')")
    argv = remote.python_call(sys.executable, "wrapper", {
        "argv": [sys.executable, "-c", code], "pid_file": None, "run_dir": "run", "process_id": 0})
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert mode(made) == 0o600 and mode(tmp_path / "run" / "sub") == 0o700
