"""A run directory is untrusted input: no file in it is written or read through a planted
symbolic link, and ``launch stacks`` / ``launch profile`` signal only a process proven to be
the run's launcher (it holds the run's lock), never one a file names. Real files, real links,
real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest

from harness.helpers import LAUNCH, REPO, env_for_tests
from launcher.rundir import record as runs
from launcher import proctl
from launcher.errors import SpecError
from launcher.rundir import runlock
from launcher.rundir import ledger
from launcher.run.logfile import LogFile
from worker.contract import runfiles

VICTIM_TEXT = "a file of the user's own\n"


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_text(VICTIM_TEXT)
    yield path
    assert path.read_text() == VICTIM_TEXT  # never written through a link


def plant(run_dir, names, target) -> None:
    for name in names:
        os.makedirs(os.path.dirname(run_dir / name), exist_ok=True)
        os.symlink(target, run_dir / name)


def test_resume_refuses_links_planted_in_the_run_directory_and_writes_through_none(tmp_path, victim):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.yaml").write_text("name: linear\n")
    plant(run_dir, ["launcher.lock", "run.json.partial", "ledger.json.tmp"], victim)
    done = subprocess.run(LAUNCH + ["jobs/linear.yaml", "--resume", str(run_dir)], cwd=REPO,
                          env=env_for_tests(), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    for name in ("launcher.lock", "run.json.partial", "ledger.json.tmp"):
        assert f"{run_dir / name} is a symbolic link; podlaunch follows no link" in done.stderr
    assert "nothing was started" in done.stderr


def test_each_writer_replaces_a_link_at_its_name_and_never_writes_through_it(tmp_path, victim):
    """A link planted after the lock was taken (or where a check cannot look) is still never
    followed: whole files are renamed over it, appended ones and the lock refuse it."""
    names = ["run.json", "run.json.partial", "ledger.json", "ledger.json.tmp"]
    plant(tmp_path, names, victim)
    runs.Record(str(tmp_path), "linear", 10).start()
    ledger.write(str(tmp_path), [{"attempt": 0, "buckets_s": {"productive": 1.0}, "wall_s": 1.0}])
    assert not os.path.islink(tmp_path / "run.json") and not os.path.islink(tmp_path / "ledger.json")
    assert json.loads((tmp_path / "run.json").read_text())["job"] == "linear"
    os.symlink(victim, tmp_path / "process-000.log")
    with pytest.raises(runfiles.LinkRefused, match="is a symbolic link"):
        LogFile(str(tmp_path / "process-000.log"), say=print)
    lock_dir = tmp_path / "locked"
    plant(lock_dir, ["launcher.lock"], victim)
    with pytest.raises(SpecError, match="launcher.lock is a symbolic link"):
        runlock.acquire(str(lock_dir), "--resume")


@pytest.mark.parametrize("name, linked", [
    ("checkpoints", "a directory"),  # a link to a directory, listed among a folder's sub-directories
    ("logs/attempt-0/process-000.log", "the victim"),  # a file's link down in a sub-directory
    ("output/attempt-0", "a directory"),
])
def test_the_run_lock_refuses_a_link_in_a_sub_directory_or_to_a_directory(tmp_path, victim, name,
                                                                           linked):
    """Not only the run directory's own files: a link anywhere below it, to a file or to a
    directory, is refused before anything is written (``runfiles.links_in``)."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True, mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plant(run_dir, [name], elsewhere if linked == "a directory" else victim)
    assert runfiles.links_in(str(run_dir)) == [str(run_dir / name)]
    with pytest.raises(SpecError, match=f"{run_dir / name} is a symbolic link"):
        runlock.acquire(str(run_dir), "--resume")
    assert not (run_dir / runlock.LOCK_FILE).exists() and not os.listdir(elsewhere)


def test_readers_of_a_run_directory_follow_no_link(tmp_path, victim):
    (tmp_path / "real.json").write_text(json.dumps({"job": "x", "state": "running"}))
    os.symlink(tmp_path / "real.json", tmp_path / "run.json")
    assert runs.read_record(str(tmp_path / "run.json")) is None
    assert ledger.read(str(tmp_path)) == []


def run_json(run_dir, pid: int) -> None:
    """A run.json naming ``pid`` as its live launcher, as a live run's looks."""
    (run_dir / "run.json").write_text(json.dumps({
        "job": "linear", "state": "running", "attempts": 0,
        "launcher": {"pid": pid, "host": socket.gethostname(), "since": proctl.start_ticks(pid)}}))


def ask(command: str, run_dir) -> subprocess.CompletedProcess:
    timeout = ["--timeout", "3"] if command == "stop" else ["--timeout-s", "3"]
    return subprocess.run(LAUNCH + [command, str(run_dir), *timeout], cwd=REPO,
                          env=env_for_tests(), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", ["stacks", "profile", "stop"])
def test_a_process_run_json_names_is_not_signalled_unless_it_holds_the_runs_lock(tmp_path, command):
    """``launch stop`` too (issue 71: a stop that signalled run.json's pid unproven passed
    every test, which covered stacks and profile alone)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sleeper = subprocess.Popen(["sleep", "300"])
    holder = None
    try:
        run_json(run_dir, sleeper.pid)
        done = ask(command, run_dir)  # no lock held at all
        assert done.returncode == 2, done.stdout + done.stderr
        assert sleeper.poll() is None, done.stdout + done.stderr
        if command != "stop":  # stop: the run has no live supervisor (docs/long-runs.md)
            assert f"no launcher holds {run_dir / 'launcher.lock'}" in done.stderr
            assert f"launch {command} signalled nothing" in done.stderr
        holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
            import sys, time
            sys.path.insert(0, {REPO!r})
            from launcher.rundir import runlock
            runlock.acquire({str(run_dir)!r}, "--run-dir")
            print("held", flush=True)
            time.sleep(300)
        """)], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline() == "held\n"
        done = ask(command, run_dir)  # a lock held, by another process than the one named
        assert "Traceback" not in done.stderr
        if command == "stop":  # the lock's holder is the run's proven launcher: it is stopped
            assert done.returncode == 0 and f"pid {holder.pid}" in done.stdout, done.stdout
            assert sleeper.poll() is None and holder.wait(10) is not None
            return
        assert done.returncode == 2, done.stdout + done.stderr
        assert (f"pid {sleeper.pid} (sleep 300), named in the run's files as its launcher, "
                f"does not hold {run_dir / 'launcher.lock'}") in done.stderr
        assert sleeper.poll() is None and holder.poll() is None  # neither was signalled
        assert not list(run_dir.glob("profile-request-*"))  # nothing was asked
    finally:
        for proc in (sleeper, holder):
            if proc is not None:
                proc.kill()
                proc.wait()


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="starts a process as user nobody (needs root)")
@pytest.mark.parametrize("command", ["stacks", "profile"])
def test_another_users_live_launcher_is_refused_in_a_sentence(tmp_path, command):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    fd = os.open(run_dir / "launcher.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:  # the other user's launcher: it holds the run's lock, as a real one does
        other = subprocess.Popen(
            ["/usr/bin/python3", "-c", f"import fcntl, time; fcntl.flock({fd}, fcntl.LOCK_EX); "
             "print('held', flush=True); time.sleep(300)"],
            pass_fds=(fd,), user="nobody", cwd="/", stdout=subprocess.PIPE, text=True)
    finally:
        os.close(fd)
    try:
        assert other.stdout.readline() == "held\n"
        run_json(run_dir, other.pid)
        done = ask(command, run_dir)
        assert done.returncode == 2, done.stdout + done.stderr
        assert (f"the run's launcher (pid {other.pid}) belongs to user nobody, not to you (root): "
                f"ask it as nobody; launch {command} signalled nothing") in done.stderr
        assert "Traceback" not in done.stderr
        assert other.poll() is None
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()


def test_the_csv_cache_in_the_run_directory_follows_no_link(tmp_path, victim):
    from worker.data import sources

    data = tmp_path / "data.csv"
    data.write_text("1,2\n3,4\n")
    name = os.path.basename(sources.csv_cache(str(data), str(tmp_path / "first")))
    cache = tmp_path / "run" / "data-cache"
    plant(cache, [name + ".lock"], victim)
    with pytest.raises(runfiles.LinkRefused, match="is a symbolic link"):
        sources.csv_cache(str(data), str(cache))
    os.remove(cache / (name + ".lock"))
    plant(cache, [name], victim)  # a planted "cache": read as the data, it would train on it
    with pytest.raises(sources.DataError, match="is a symbolic link"):
        sources.csv_cache(str(data), str(cache))


def _as_nobody(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["su", "nobody", "-s", "/bin/sh", "-c",
                           f"cd {REPO} && PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 {command}"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", ["stacks", "profile"])
def test_asking_another_users_live_run_is_a_sentence_not_a_permission_error(command):
    """As user nobody, ``launch stacks`` of a live run of root's: refused by whose it is."""
    if os.geteuid() != 0 or _as_nobody("-c 'import launcher.cli'").returncode != 0:
        pytest.skip("runs the CLI as user nobody: needs root, /usr/bin/python3 with PyYAML and "
                    "a checkout that user can read")
    top = tempfile.mkdtemp(prefix="podlaunch-other-user-", dir="/tmp")
    try:
        os.chmod(top, 0o755)
        run_dir = os.path.join(top, "run")
        holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
            import os, sys, time
            sys.path.insert(0, {REPO!r})
            from launcher.rundir import record as runs
            from launcher.rundir import runlock
            runlock.acquire({run_dir!r}, "--run-dir")
            os.chmod({run_dir!r}, 0o755)
            runs.Record({run_dir!r}, "linear", 10).start()
            print("held", flush=True)
            time.sleep(300)
        """)], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline() == "held\n"
            done = _as_nobody(f"-m launcher.cli {command} {run_dir} --timeout-s 3")
            assert done.returncode == 2, done.stdout + done.stderr
            assert "Traceback" not in done.stderr and "PermissionError" not in done.stderr
            assert (f"{run_dir} belongs to user root, not to you (nobody), mode 0755; podlaunch "
                    "reads back and acts on your own runs only") in done.stderr
            assert holder.poll() is None
        finally:
            holder.kill()
            holder.wait()
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_answers_are_found_without_walking_a_directory_link_planted_in_the_logs(tmp_path):
    from launcher.commands import stacks as stacks_command
    from launcher.run import stacks

    (tmp_path / "logs" / "attempt-1").mkdir(parents=True)
    (tmp_path / "logs" / "attempt-1" / stacks.ANSWER_FILE).write_text(json.dumps({"at": 5.0}))
    os.symlink(tmp_path, tmp_path / "logs" / "loop")  # walked, it would find the answer again and again
    assert stacks_command.answers(str(tmp_path), stacks.ANSWER_FILE) == [{"at": 5.0}]
