"""A run directory steers nothing it merely says: another user's directory is refused, a
journal that does not prove itself runs no command, a process the journal names is signalled
only once it shows the run's secret, an output file is the run's own path, a copied run takes
back nothing of the original's, and no secret value is in any command line. Real files, real
processes, a second local user (``nobody``) where one is needed."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys

import pytest

from harness.detached import launch, step, supervisor, supervisors, until  # noqa: F401 (a fixture)
from harness.helpers import LAUNCH, REPO, env_for_tests, run_pids
from launcher import owned, proctl
from launcher.rundir import runlock
from launcher.plan import ProcessPlan
from launcher.rundir import journal

PRIVATE_TEXT = "-----BEGIN OPENSSH PRIVATE KEY----- not for the logs"


@pytest.fixture
def state(tmp_path):
    """A state folder of the test's own for the user's key (XDG_STATE_HOME), and that key."""
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(folder)
    try:
        yield folder, owned.key(create=True)
    finally:
        if old is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = old


def _nobody() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("a directory of a second user (nobody) is made with chown: needs root")
    return pwd.getpwnam("nobody")


def _cli(*args, state_dir=None, cwd=REPO) -> subprocess.CompletedProcess:
    extra = {} if state_dir is None else {"XDG_STATE_HOME": str(state_dir)}
    return subprocess.run(LAUNCH + list(args), cwd=cwd, env=env_for_tests(**extra),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def _killed_run(run_dir) -> None:
    """A run directory whose supervisor is gone: run.json says running, nobody holds the lock."""
    run_dir.mkdir(mode=0o700)
    (run_dir / "run.json").write_text(json.dumps({"job": "linear", "state": "running",
                                                  "launcher": {"pid": 1}}))
    (run_dir / "spec.yaml").write_text("name: linear\n")
    (run_dir / runlock.LOCK_FILE).write_text("{}\n")


def test_a_run_directory_another_user_made_is_refused_by_owner_and_mode(tmp_path):
    who = _nobody()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chown(shared, who.pw_uid, who.pw_gid)
    os.chmod(shared, 0o777)
    for args in (("--run-dir", str(shared)), ("--run-dir", str(shared), "--dry-run")):
        done = _cli("jobs/linear.yaml", *args)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        assert f"{shared} belongs to user nobody, not to you (root), mode 0777" in done.stderr
        assert os.listdir(shared) == []
    # every command that reads a run back says whose it is, and reads nothing
    _killed_run(tmp_path / "theirs")
    os.chmod(tmp_path / "theirs", 0o755)
    for path in [tmp_path / "theirs", *(tmp_path / "theirs").iterdir()]:
        os.chown(path, who.pw_uid, who.pw_gid)
    for command in (["logs"], ["attach"], ["wait", "--timeout", "1"], ["stop"], ["stacks"],
                    ["profile"]):
        done = _cli(*command, str(tmp_path / "theirs"))
        assert done.returncode == 2, (command, done.stdout + done.stderr)
        assert "Traceback" not in done.stderr
        assert "belongs to user nobody, not to you (root)" in done.stderr, (command, done.stderr)
    done = _cli("jobs/linear.yaml", "--resume", str(tmp_path / "theirs"))
    assert done.returncode == 2 and "belongs to user nobody" in done.stderr, done.stderr
    (tmp_path / "runs" / "linear").mkdir(parents=True)
    shutil.move(tmp_path / "theirs", tmp_path / "runs" / "linear" / "theirs")
    done = _cli("runs", "--root", str(tmp_path / "runs"))
    assert done.returncode == 0 and "nobody's run (not read)" in done.stdout, done.stdout


def test_a_run_directory_others_may_write_is_refused_and_an_empty_one_of_ones_own_made_private(
        tmp_path):
    run_dir = tmp_path / "open"
    _killed_run(run_dir)
    # each side of the check (issue 71: a check that refused 0777 and trusted 0770 passed)
    for mode, whom in ((0o777, "group and others"), (0o770, "group"), (0o702, "others")):
        os.chmod(run_dir, mode)
        for args in (("attach", str(run_dir)), ("jobs/linear.yaml", "--resume", str(run_dir))):
            done = _cli(*args)
            assert done.returncode == 2, done.stdout + done.stderr
            assert f"{run_dir} is writable by {whom} (mode {mode:04o})" in done.stderr
            assert f"chmod go-w {run_dir}" in done.stderr
    os.chmod(run_dir, 0o700)
    os.chmod(run_dir / "run.json", 0o666)  # a file others may write is refused as theirs
    done = _cli("logs", str(run_dir))
    assert "Traceback" not in done.stderr
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o777)
    os.chmod(empty, 0o777)
    done = _cli("jobs/linear.yaml", "--run-dir", str(empty), "--set", "train.num_steps=1",
                "--set", "cluster.num_processes=1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert oct(os.stat(empty).st_mode & 0o777) == "0o700"


def _forged(run_dir, marker, seal_key=None, sealed_for=None) -> None:
    """A journal a stranger wrote: "starting" (the take-back would start the attempt again)
    with their own job: a program that leaves ``marker``."""
    job = run_dir.parent / "theirs.yaml"
    job.write_text(f"name: linear\nprogram:\n  argv: [{sys.executable}, -c, "
                   f"\"open('{marker}', 'w').write('ran')\"]\ncluster:\n  num_processes: 1\n")
    data = {"version": journal.VERSION, "backend": "local", "adopts": True,
            "argv": [str(job)], "cwd": str(run_dir.parent), "attempt": 0, "starting": True,
            "workers": [], "nonce": "n"}
    if seal_key is not None:
        data = owned.seal(str(sealed_for or run_dir), data, seal_key)
    (run_dir / journal.JOURNAL_FILE).write_text(json.dumps(data))
    os.chmod(run_dir / journal.JOURNAL_FILE, 0o600)


@pytest.mark.parametrize("how", ["unsealed", "another key", "sealed for another directory"])
def test_a_journal_that_does_not_prove_itself_runs_nothing(tmp_path, state, how):
    folder, key = state
    run_dir, marker = tmp_path / "run", tmp_path / "ran"
    _killed_run(run_dir)
    seal_key = {"unsealed": None, "another key": os.urandom(32)}.get(how, key)
    _forged(run_dir, marker, seal_key, tmp_path / "elsewhere" if how.endswith("directory") else None)
    done = _cli("attach", str(run_dir), state_dir=folder)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert f"the run's journal ({run_dir / journal.JOURNAL_FILE}) is not trusted" in done.stderr
    assert "nothing was taken back or signalled" in done.stderr
    assert not marker.exists()
    # the supervisor's own entry refuses it the same way (what attach would start)
    done = _cli("--adopt", str(run_dir), state_dir=folder)
    assert done.returncode == 2 and "is not trusted" in done.stderr and not marker.exists()


def test_a_process_the_journal_names_is_signalled_only_if_it_shows_the_runs_secret(
        tmp_path, state, monkeypatch):
    """Even a journal that passes its seal names a process of the user's (a ``sleep``) as
    process 0's wrapper, and a private file as its output: the process is never signalled,
    the file never read."""
    from launcher.backends.local import adopt as localadopt

    _, key = state
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    monkeypatch.setenv(owned.SECRET_VAR, owned.run_secret(str(run_dir), "n", key))
    private = tmp_path / "id_ed25519"
    private.write_text(PRIVATE_TEXT + "\n")
    # a process of the user's own that is not the run's: it does not carry the run's secret
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True, env={
        k: v for k, v in os.environ.items() if k != owned.SECRET_VAR})
    try:
        # exec'd, not only forked: until its exec the child has this process's environment,
        # the run's secret among it (a flake waiting only for its start tick)
        until(lambda: _cmdline(sleeper.pid).startswith(b"sleep\0"), "the sleep exec'd")
        plan = ProcessPlan(process_id=0, host="localhost", local_device_count=1, argv=("x",), env={},
                           log_path=str(run_dir / "logs" / "process-000.log"),
                           run_dir=str(run_dir))
        record = {"process_id": 0, "pid": sleeper.pid, "since": proctl.start_ticks(sleeper.pid),
                  "pgid": sleeper.pid, "token": "t", "out": str(private), "offset": 0}
        [worker] = localadopt.adopt(type("P", (), {"processes": [plan]})(), [record])
        assert worker.out_path == str(run_dir / "output" / "attempt-0" / "process-000.out")
        assert worker.pgid is None
        worker.terminate()
        worker.kill()
        assert PRIVATE_TEXT not in "".join(worker.lines())
        ended = worker.poll()
        assert "does not show the run's directory and secret" in ended.why
        assert sleeper.poll() is None  # never signalled
        assert localadopt.stop_strays(str(run_dir), timeout_s=1.0) == []
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _cmdlines_holding(values) -> list:
    found = []
    for pid in proctl.pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        found += [f"pid {pid}: {value}" for value in values if value in text]
    return found


@pytest.mark.slow
def test_a_copied_run_takes_back_nothing_a_resume_beside_live_workers_starts_none_and_no_secret_is_in_a_command_line(
        tmp_path, supervisors):
    run_dir, copy = tmp_path / "r", tmp_path / "copy"
    secrets = ("hf_tok3n_never_in_ps", "pw_n3ver_in_ps")
    started = launch("jobs/linear.yaml", "--set", "train.num_steps=1000000",
                     "--set", "logging.log_every_steps=20", "--set", "task.name=faulty_task:make",
                     "--set", "task.args.sleep_s=0.03", "--set", f"cluster.env.HF_TOKEN={secrets[0]}",
                     "--set", f"cluster.env.DATABASE_URL=postgres://u:{secrets[1]}@db/x",
                     "--run-dir", str(run_dir), "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    first = supervisor(run_dir)
    supervisors.append(first)
    workers = until(lambda: (lambda p: p if len(p) == 2 else None)(run_pids(str(run_dir))),
                    "both workers")
    assert _cmdlines_holding(secrets) == []  # the supervisor, its wrappers, its workers
    os.kill(first, signal.SIGKILL)
    until(lambda: proctl.state(first) in (None, "Z"), "the supervisor gone")
    shutil.copytree(run_dir, copy, symlinks=True)
    done = _cli("attach", str(copy))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is not trusted" in done.stderr and "a copy of a run is another run" in done.stderr
    done = _cli("jobs/linear.yaml", "--set", "task.name=faulty_task:make", "--set",
                "train.num_steps=1000000", "--resume", str(run_dir))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the run's processes still run" in done.stderr
    assert f"launch attach {run_dir}" in done.stderr
    assert sorted(run_pids(str(run_dir))) == sorted(workers)  # untouched, and none beside them
    attached = subprocess.Popen(LAUNCH + ["attach", str(run_dir)], cwd=REPO, env=env_for_tests(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL)
    try:
        until(lambda: supervisor(run_dir) != first, "the supervisor that took the run back")
        supervisors.append(supervisor(run_dir))
        reached = step(run_dir)
        until(lambda: step(run_dir) >= reached + 40, "steps after the take-back")
        assert _cmdlines_holding(secrets) == []  # the supervisor that took it back too
        assert sorted(run_pids(str(run_dir))) == sorted(workers)  # the very same workers
        stopped = _cli("stop", str(run_dir))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        out, _ = attached.communicate(timeout=120)
    finally:
        attached.kill()
    assert attached.returncode == 130, out
    assert "taking the run back" in out
    lines = [line for line in out.splitlines() if line.strip()]
    repeated = {line for line in lines if lines.count(line) > 1 and " step " in line}
    assert not repeated, repeated  # the take-back's lines shown once on this terminal
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"


# every name the launcher reads or writes in a run directory, and what may be planted there
PLANTED_NAMES = ("run.json", journal.JOURNAL_FILE, runlock.LOCK_FILE, "ledger.json", "launcher.log",
                 "spec.yaml", "job.json", "console.log", "logs/process-000.log", "launch.json")
KINDS = ("link", "garbage", "another owner", "world-writable")
GARBAGE = b"\x00\xff{[\"garbage\": 1e999999, \"offset\": -7}\n\x1b[2J"


def _run_dir_with(tmp_path, state: str, name: str, kind: str, victim, sentinel: int):
    """A run directory (``state``: its run.json's) with ``kind`` planted at ``name``; every
    other file names ``sentinel`` (a process outside the run) as its launcher and process."""
    run_dir = tmp_path / "runs" / "linear" / f"{state}-{kind.replace(' ', '-')}-{name.replace('/', '-')}"
    (run_dir / "logs").mkdir(parents=True, mode=0o700)
    os.chmod(run_dir, 0o700)
    files = {
        "run.json": json.dumps({"job": "linear", "state": "running" if state == "live" else state,
                                "step": 3,
                                "launcher": {"pid": sentinel, "host": os.uname().nodename}}),
        journal.JOURNAL_FILE: json.dumps({"version": journal.VERSION, "backend": "local",
                                          "adopts": True, "argv": ["jobs/linear.yaml"],
                                          "cwd": REPO, "attempt": 0, "workers": [
                                              {"process_id": 0, "pid": sentinel, "since": 1,
                                               "token": "t", "out": str(victim)}]}),
        runlock.LOCK_FILE: json.dumps({"pid": sentinel}), "ledger.json": "[]",
        "launcher.log": "2026-12-06T10:00:00.000Z podlaunch: a line\n",
        "spec.yaml": "name: linear\n", "job.json": "{}", "console.log": "",
        "launch.json": json.dumps({"job": os.path.join(REPO, "jobs", "linear.yaml"),
                                   "cluster": None, "overrides": []}),
        "logs/process-000.log": "2026-12-06T10:00:00.000Z step 1\n"}
    for file, text in files.items():
        (run_dir / file).write_text(text)
        os.chmod(run_dir / file, 0o600)
    path = run_dir / name
    if kind == "link":
        path.unlink()
        os.symlink(victim, path)
    elif kind == "garbage":
        path.write_bytes(GARBAGE)
    elif kind == "another owner":
        who = pwd.getpwnam("nobody")
        os.chown(path, who.pw_uid, who.pw_gid)
        os.chmod(path, 0o644)
    else:
        os.chmod(path, 0o666)
    return run_dir


def _holding(run_dir) -> subprocess.Popen | None:
    """A process that holds ``run_dir``'s lock (a live run's launcher), or None where the
    lock file planted there cannot be locked (a link, another user's)."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(run_dir / runlock.LOCK_FILE)!r}, os.O_RDWR | os.O_NOFOLLOW)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)\n")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if holder.stdout.readline() != "held\n":
        holder.wait()
        return None
    return holder


COMMANDS = (["logs"], ["logs", "--process", "0"], ["logs", "-f"], ["wait", "--timeout", "0.2"],
            ["attach"], ["stop", "--timeout", "0.2"], ["stacks", "--timeout-s", "0.2"],
            ["profile", "--timeout-s", "0.2"], ["runs", "--root"], ["resume"], ["continue"])


# a live run's launcher (a process holding its lock) is the run's own, and would be signalled
# by stop, stacks and profile as it should: those ask a live run only where nothing holds it
LIVE_ONLY_READS = ("logs", "wait", "runs", "resume", "continue")


@pytest.mark.parametrize("state", ["live", "running", "succeeded"])
def test_what_is_planted_at_each_name_of_a_run_directory_steers_no_command(
        tmp_path, state, capsys, monkeypatch):
    """A link, a garbage file, a file of another owner and a world-writable file at each name
    the launcher reads or writes, in a run whose supervisor is gone (``running``) and in an
    ended one: every run command answers in a sentence (no traceback), writes through no link,
    prints no byte of a file a link points at, and signals no process outside the run."""
    if os.geteuid() != 0:
        pytest.skip("a file of another owner (nobody) is made with chown: needs root")
    from launcher import cli

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    victim = tmp_path / "victim"
    victim.write_text(PRIVATE_TEXT + "\n")
    sentinel = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        for name in PLANTED_NAMES:
            for kind in KINDS:
                run_dir = _run_dir_with(tmp_path, state, name, kind, victim, sentinel.pid)
                holder = _holding(run_dir) if state == "live" else None
                for command in COMMANDS:
                    if holder is not None and (command[0] not in LIVE_ONLY_READS
                                               or command == ["logs", "-f"]):
                        continue
                    if command[0] == "runs":
                        argv = [*command, str(tmp_path / "runs"), "linear"]
                    elif command[0] == "resume":
                        argv = ["jobs/linear.yaml", "--resume", str(run_dir), "--dry-run"]
                    elif command[0] == "continue":  # launch resume RUN: launch.json's job
                        argv = ["resume", str(run_dir), "--dry-run"]
                    else:
                        argv = [command[0], str(run_dir), *command[1:]]
                    try:
                        code = cli._run(argv)  # a traceback would be an exception here
                    except SystemExit as exc:  # argparse's usage error
                        code = exc.code
                    out = capsys.readouterr()
                    said = f"{name} as {kind}: launch {' '.join(argv)}"
                    if os.environ.get("SHOW_PLANTED"):
                        print(said, code, (out.out + out.err)[-160:].replace("\n", " | "), file=sys.__stderr__)
                    assert code in (0, 1, 2, 124), (said, code, out.err)
                    assert PRIVATE_TEXT not in out.out + out.err, said
                    assert victim.read_text() == PRIVATE_TEXT + "\n", said
                    assert sentinel.poll() is None, said
                if holder is not None:
                    assert holder.poll() is None  # never signalled by a reader
                    holder.kill()
                    holder.wait()
    finally:
        sentinel.kill()
        sentinel.wait()
