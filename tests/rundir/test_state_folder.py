"""Every folder and file podlaunch keeps outside a run directory is the user's own, as a run
directory is: the podlaunch folder (``$XDG_STATE_HOME/podlaunch``: the key, the index of runs)
and the Slurm step tags' folder refuse a link, another owner, a loose mode, a FIFO or a device
in one sentence; a run is one run by any path to it; nothing podlaunch makes is writable by
group or others whatever the umask."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time

import pytest

from harness.helpers import launch
from launcher import owned
from launcher.errors import SpecError
from launcher.rundir import index


@pytest.fixture
def state(tmp_path, monkeypatch):
    """``$XDG_STATE_HOME`` of the test's own; its podlaunch folder (not made)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "podlaunch"


def _run_dir(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    (run_dir / "spec.yaml").write_text("name: linear\n")
    return run_dir


def _no_hang():
    """A test that would hang on a FIFO fails instead (SIGALRM after 10 s)."""
    def hung(*_):
        raise AssertionError("hung on a FIFO")
    signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)


@pytest.mark.parametrize("planted, said", [
    ("link", "is a link"),
    ("other", "belongs to user nobody, not to you"),
    ("loose", "is writable by group and others (mode 0777)"),
])
def test_a_podlaunch_folder_that_is_not_the_users_own_is_refused_in_one_sentence(
        tmp_path, state, planted, said):
    """``--detach`` refused it (its key is there) but a plain launch still wrote the index of
    runs into it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state.parent.mkdir()
    if planted == "link":
        state.symlink_to(elsewhere)
    else:
        state.mkdir(mode=0o700)
        if planted == "other":
            os.chown(state, 65534, 65534)
        else:
            os.chmod(state, 0o777)
    run_dir = _run_dir(tmp_path)
    for call in (lambda: index.add(str(run_dir)), index.runs, lambda: owned.key(create=True)):
        with pytest.raises(SpecError) as refused:
            call()
        message = refused.value.problems[0].message
        assert f"your podlaunch folder {state} (your key and index of runs) {said}" in message, message
    assert os.listdir(elsewhere) == []  # nothing written through a link


@pytest.mark.parametrize("planted", ["fifo", "device", "link", "other"])
def test_a_file_of_the_podlaunch_folder_that_is_not_a_regular_one_of_the_users_is_refused(
        tmp_path, state, planted):
    """A FIFO put in the index's place hung every later launch."""
    state.mkdir(parents=True, mode=0o700)
    path = state / index.INDEX_FILE
    if planted == "fifo":
        os.mkfifo(path, 0o600)
    elif planted == "device":
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's
    elif planted == "link":
        (tmp_path / "target").write_text("")
        path.symlink_to(tmp_path / "target")
    else:
        path.write_text("")
        os.chown(path, 65534, 65534)
    run_dir = _run_dir(tmp_path)
    _no_hang()
    try:
        for call in (lambda: index.add(str(run_dir)), index.runs):
            with pytest.raises(SpecError, match=f"{path}, in your podlaunch folder, "):
                call()
    finally:
        signal.alarm(0)
    assert planted != "link" or (tmp_path / "target").read_text() == ""


def test_a_launch_beside_a_fifo_at_the_index_is_refused_at_once_and_starts_nothing(tmp_path):
    state = tmp_path / "state" / "podlaunch"
    state.mkdir(parents=True, mode=0o700)
    os.mkfifo(state / index.INDEX_FILE, 0o600)
    began = time.monotonic()
    done = launch("jobs/linear.yaml", "--set", "cluster.num_processes=1", "--run-dir",
                  str(tmp_path / "run"), XDG_STATE_HOME=str(tmp_path / "state"), timeout_s=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert (f"error: launch: {state / index.INDEX_FILE}, in your podlaunch folder, is not a "
            "regular file (a FIFO or a device)") in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and time.monotonic() - began < 30
    assert not os.path.exists(tmp_path / "run" / "logs")


def test_a_run_reached_through_a_linked_folder_is_the_same_run(tmp_path):
    """A run started through a linked path was not recognised as the live one: ``--resume``
    through the real path started a second set of workers beside the live process."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "linked").symlink_to(real)
    run_dir = real / "run"
    run_dir.mkdir(mode=0o700)
    live = subprocess.Popen(["sleep", "60"], env={
        **os.environ, owned.RUN_DIR_VAR: str(tmp_path / "linked" / "run")})
    try:
        for asked in (run_dir, tmp_path / "linked" / "run"):
            assert owned.processes_of(str(asked)) == [live.pid], asked
            with pytest.raises(SpecError, match=f"the run's processes still run .*pid {live.pid}"):
                owned.refuse_live_processes(str(asked), "RUN")
        assert owned.real_path(str(tmp_path / "linked" / "run")) == str(run_dir)
    finally:
        live.kill()
        live.wait()


@pytest.mark.slow  # a real worker
def test_nothing_a_run_makes_is_writable_by_group_or_others_under_umask_000(tmp_path):
    """Under ``umask 000`` a run's ``logs/`` was 0777, a TensorBoard events file 0666 and the
    podlaunch folder 0777."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        ["sh", "-c", 'umask 000 && exec "$@"', "sh", *launch.__globals__["LAUNCH"],
         "jobs/linear.yaml", "--set", "train.num_steps=5", "--set", "cluster.num_processes=1",
         "--run-dir", str(run_dir)], cwd=launch.__globals__["REPO"], capture_output=True,
        text=True, timeout=300,
        env=launch.__globals__["env_for_tests"](XDG_STATE_HOME=str(tmp_path / "state")))
    assert done.returncode == 0, done.stdout + done.stderr
    loose = []
    for top in (run_dir, tmp_path / "state"):
        for folder, dirs, files in os.walk(top):
            for path in [folder] + [os.path.join(folder, n) for n in files]:
                if os.lstat(path).st_mode & 0o022:
                    loose.append((path, oct(stat.S_IMODE(os.lstat(path).st_mode))))
    assert loose == []
    assert any(name.startswith("events.") for _, _, files in os.walk(run_dir / "tensorboard")
               for name in files)
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "podlaunch").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(run_dir / "logs").st_mode) == 0o755
