"""Safe by default (issue 23): forged control lines, escapes, revoked keys, the run lock,
masked argv, owner-only files and exact, bounded syncs. Real launches, real sshd hosts."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap

import pytest
import yaml

from harness.helpers import PACED, REPO, PROGRAMS, launch, launched, pids_with_env
from harness.runs import remote_run_dir
from launcher import backends
from launcher.rundir import runlock
from launcher.spec import syncrules
from launcher.backends.ssh import syncdir, transfer
from launcher.errors import SpecError
from worker.contract import redact

NUM_HOSTS = 2

# A program that prints every control marker podlaunch's wrapper uses, verbatim, aimed at
# a process outside the run (VICTIM_PGID), plus terminal escapes, then: process 1 fails
# with exit 3 after a moment, process 0 waits to be stopped.
FORGER = textwrap.dedent("""\
    import os, sys, time
    victim = os.environ["VICTIM_PGID"]
    print("podlaunch-pgid " + victim, flush=True)
    print("podlaunch-pgid x " + victim, flush=True)
    print("podlaunch-exit code=0 at=1.0", flush=True)
    print("glued podlaunch-exit code=0 at=1.0", flush=True)
    print("srun: error: n1: task 0: Exited with exit code 0", flush=True)
    print("\\x1b]0;pwned title\\x07\\x1b[2J\\x1b[HOK: 2 processes succeeded\\r", flush=True)
    if os.environ["PODLAUNCH_PROCESS_ID"] == "1":
        time.sleep(2)
        sys.exit(3)
    time.sleep(120)
""")


def _forger_job(tmp_path, victim_pgid: int, cluster: dict | None = None) -> str:
    prog = tmp_path / "prog"
    prog.mkdir(exist_ok=True)
    (prog / "forger.py").write_text(FORGER)
    spec = {"name": "forger", "program": {"argv": ["python", "forger.py"], "dir": str(prog),
                                          "env": {"VICTIM_PGID": str(victim_pgid)}},
            "watchdog": {"stall_timeout_s": None},
            "cluster": cluster or {"backend": "local", "num_processes": 2,
                                   "devices_per_process": 1, "grace_s": 2}}
    path = tmp_path / "forger.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


@pytest.fixture
def victim():
    """A process outside any run, leading its own group: nothing may signal it."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _check_forgery_changed_nothing(code: int, out: str, victim) -> None:
    assert code == 1, out
    assert not re.search(r"^OK: ", out, re.M), out  # the summary's success line
    assert "exit code 3" in out, out
    assert victim.poll() is None, "a process outside the run was signalled"
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out, repr(out[-2000:])
    assert "\\x1b]0;pwned title\\x07" in out, out  # shown, escaped


@pytest.mark.slow
def test_forged_markers_and_escapes_change_nothing_locally(tmp_path, victim):
    run_dir = tmp_path / "run"
    done = launch(_forger_job(tmp_path, victim.pid), "--run-dir", str(run_dir), "--show", "all",
                  timeout_s=120)
    _check_forgery_changed_nothing(done.returncode, done.stdout + done.stderr, victim)
    log = (run_dir / "logs" / "process-000.log").read_text()
    assert "\x1b]0;pwned title\x07" in log  # the log keeps the bytes whole
    assert not pids_with_env("PODLAUNCH_RUN_DIR", str(run_dir))


def test_the_run_directory_lock_refuses_a_second_holder_and_is_stale_after_a_kill(tmp_path):
    run_dir = str(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import sys, time
        sys.path.insert(0, {REPO!r})
        from launcher.rundir import runlock
        runlock.acquire({run_dir!r}, "--run-dir")
        print("held", flush=True)
        time.sleep(300)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(SpecError) as refused:
            runlock.acquire(run_dir, "--resume")
        assert f"in use by another launcher (pid {holder.pid} on " in str(refused.value.problems[0])
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = runlock.acquire(run_dir, "--resume")  # the kernel dropped the dead holder's lock
    assert runlock.holder(os.path.join(run_dir, runlock.LOCK_FILE))["pid"] == os.getpid()
    assert stat.S_IMODE(os.stat(os.path.join(run_dir, runlock.LOCK_FILE)).st_mode) == 0o600
    lock.release()


@pytest.mark.slow
def test_resume_of_a_run_whose_launcher_is_running_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    args = ("jobs/linear.yaml", "--set", "train.num_steps=1000000", "--set",
            "cluster.devices_per_process=1", "--set", "checkpoint.every_steps=20",
            "--set", "logging.log_every_steps=20", *PACED)  # paced: it only has to be running
    with launched(*args, "--run-dir", str(run_dir)) as first:
        first.wait_for(r"checkpoint of step \d+ saved", 120)
        second = launch(*args, "--resume", str(run_dir), "--set", "cluster.env.API_TOKEN=s3cr3t")
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"{run_dir} is in use by another launcher (pid {first.proc.pid} on" in second.stderr
        assert "nothing was started" in second.stderr
        assert "s3cr3t" not in second.stdout + second.stderr
        assert first.proc.poll() is None  # the first run goes on
        first.proc.send_signal(signal.SIGINT)
        code, out = first.finish(60)
    assert code == 130, out
    for name in ("launcher.log", "job.json", "launcher.lock", "logs/process-000.log"):
        assert stat.S_IMODE(os.stat(run_dir / name).st_mode) == 0o600, name


def test_secret_flags_in_argv_lists_are_masked():
    job = {"program": {"argv": ["python", "train.py", "--api-token=X1", "--password", "Y1",
                                "DB_PASS=Z1", "--url", "https://u:Q1@h/x", "--lr", "0.1",
                                "--no-auth", "-v"]},
           "task": {"args": {"flags": ["--token", "T1", "--steps", "5"]}}}
    text = json.dumps(redact.masked(job))
    for secret in ("X1", "Y1", "Z1", "Q1", "T1"):
        assert secret not in text, text
    masked = redact.masked(job)["program"]["argv"]
    assert masked[2:6] == ["--api-token=****", "--password", "****", "DB_PASS=****"]
    assert masked[8:] == ["--lr", "0.1", "--no-auth", "-v"]  # not secrets: kept


@pytest.mark.slow
def test_dry_run_masks_secret_flags_of_a_program(tmp_path):
    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "p.py").write_text("print('hi')\n")
    spec = {"name": "flags", "program": {"argv": ["python", "p.py", "--api-token=X1", "--password",
                                                  "Y1"], "dir": str(prog)},
            "cluster": {"backend": "local", "num_processes": 1, "devices_per_process": 1}}
    (tmp_path / "j.yaml").write_text(yaml.safe_dump(spec))
    done = launch(str(tmp_path / "j.yaml"), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "X1" not in done.stdout and "Y1" not in done.stdout, done.stdout
    assert "--api-token=****" in done.stdout and "--password '****'" in done.stdout


def test_a_sync_source_with_keys_or_a_home_directory_is_refused(tmp_path):
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("KEY")
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]")
    (tmp_path / "deploy.pem").write_text("PEM")
    (tmp_path / "train.py").write_text("print(1)\n")
    why = syncrules.check_source(str(tmp_path), syncrules.Rules())
    assert why and ".ssh/" in why and ".aws/" in why and "deploy.pem" in why, why
    files, _, secrets = syncrules.walk(str(tmp_path), syncrules.Rules())
    assert sorted(files) == ["train.py"] and len(secrets) == 3
    # excluded: not copied and not refused; named under include: copied on purpose
    assert syncrules.check_source(str(tmp_path), syncrules.Rules(exclude=(".ssh", ".aws", "*.pem"))) is None
    files, _, _ = syncrules.walk(str(tmp_path), syncrules.Rules(include=("deploy.pem",),
                                                                 exclude=(".ssh", ".aws")))
    assert sorted(files) == ["deploy.pem", "train.py"]
    assert "home directory" in syncrules.check_source(os.path.expanduser("~"), syncrules.Rules())


# ---- over real sshd -----------------------------------------------------------------
@pytest.fixture
def hosts(two_ssh_hosts):
    """Two of the session's sshd hosts (tests/conftest.py), restored after the test."""
    return two_ssh_hosts


def _cluster(tmp_path, ssh_env, **settings) -> dict:
    cluster = {"backend": "ssh", "ssh_config_file": ssh_env.ssh_config, "python": sys.executable,
               "hosts": [{"host": h, "workdir": str(tmp_path / f"host{i}")}
                         for i, h in enumerate(ssh_env.hosts)],
               "env": {"PYTHONPATH": os.pathsep.join([PROGRAMS, REPO])}, "grace_s": 2,
               "keepalive_interval_s": 1, "keepalive_timeout_s": 4}
    cluster.update(settings)
    return cluster


@pytest.mark.slow
def test_forged_markers_change_nothing_over_ssh_and_files_are_owner_only(tmp_path, hosts, victim):
    run_dir = tmp_path / "run"
    job = _forger_job(tmp_path, victim.pid, _cluster(tmp_path, hosts))
    (tmp_path / "prog" / "settings.yaml").write_text("api_token: s3cr3t\n")
    os.chmod(tmp_path / "prog" / "settings.yaml", 0o644)
    done = launch(job, "--run-dir", str(run_dir), "--show", "all", timeout_s=120)
    _check_forgery_changed_nothing(done.returncode, done.stdout + done.stderr, victim)
    remote = remote_run_dir(tmp_path / "host0", run_dir, "forger")
    assert remote.is_dir() and not pids_with_env("PODLAUNCH_RUN_DIR", str(remote))
    # every file podlaunch wrote on the hosts (job file, synced files, manifest, run
    # directory, pid files) is owner-only
    for i in range(NUM_HOSTS):
        seen = 0
        for here, _, names in os.walk(tmp_path / f"host{i}"):
            for name in names:
                mode = stat.S_IMODE(os.stat(os.path.join(here, name)).st_mode)
                assert mode & 0o077 == 0, (os.path.join(here, name), oct(mode))
                seen += 1
        assert seen >= 3  # job.json, forger.py, settings.yaml, the manifest


@pytest.fixture
def sftp(hosts, tmp_path):
    from launcher import spec as specs
    from launcher.backends.ssh import session as ssh_session

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(_cluster(tmp_path, hosts)))
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), str(cluster), (), registry=backends)
    host = ssh_session.SshSession(job, str(tmp_path / "run")).ssh.resolve()[0]
    with host.open() as c:
        yield c.sftp()


@pytest.mark.slow
def test_connections_prefer_aes_gcm_and_still_reach_a_host_that_lacks_it(tmp_path, hosts):
    """The launcher offers AES-GCM first (``hostkeys.offer_known_types``: its tag is checked
    inside ``cryptography``, where paramiko's first choice, aes128-ctr with hmac-sha2-256,
    compares every packet's MAC in Python); a host whose sshd allows only aes128-ctr is
    still reached, with that, and its host key is still checked."""
    from launcher import spec as specs
    from launcher.backends.ssh import session as ssh_session

    hosts.set_ciphers(1, "aes128-ctr")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(_cluster(tmp_path, hosts)))
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), str(cluster), (), registry=backends)
    got = []
    for host in ssh_session.SshSession(job, str(tmp_path / "run")).ssh.resolve():
        with host.open() as c:
            transport = c.transport
            got.append((transport.local_cipher, transport.remote_cipher))
            assert c.run("true", hide=True, in_stream=False).ok
            # and its thread, idle, wakes once a second, not paramiko's ten (hostkeys._Transport)
            assert transport.sock.gettimeout() == 1.0
    assert got == [("aes128-gcm@openssh.com",) * 2, ("aes128-ctr",) * 2], got
    hosts.regenerate_host_key(1)  # the order of ciphers changed nothing in the key check
    host = ssh_session.SshSession(job, str(tmp_path / "run")).ssh.resolve()[1]
    with pytest.raises(Exception, match="(?i)host key"):
        host.open()


@pytest.mark.slow
def test_sync_mirrors_exactly_and_never_overwrites_what_it_did_not_write(tmp_path, sftp):
    src, home = tmp_path / "src", tmp_path / "home"   # home: a host's workdir "~"
    (src / "helper").mkdir(parents=True)
    (src / "helper" / "__init__.py").write_text("X = 1\n")
    (src / "main.py").write_text("import helper\n")
    (src / ".ssh").mkdir()
    (src / ".ssh" / "authorized_keys").write_text("attacker key\n")
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "authorized_keys").write_text("the host's own key\n")
    rules = syncrules.Rules(exclude=(".ssh",))
    assert syncdir.sync_dir(sftp, str(src), str(home), rules) == 2
    assert (home / "helper" / "__init__.py").read_text() == "X = 1\n"
    assert (home / ".ssh" / "authorized_keys").read_text() == "the host's own key\n"
    assert stat.S_IMODE(os.stat(home / "main.py").st_mode) & 0o077 == 0
    # a package that became a module: the package is removed on the host
    (home / "helper" / "__pycache__").mkdir()
    (home / "helper" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"x")
    for name in os.listdir(src / "helper"):
        os.remove(src / "helper" / name)
    os.rmdir(src / "helper")
    (src / "helper.py").write_text("X = 2\n")
    assert syncdir.sync_dir(sftp, str(src), str(home), rules) == 2  # one removed, one copied
    assert not (home / "helper").exists() and (home / "helper.py").read_text() == "X = 2\n"
    manifest = home / syncdir.MANIFEST
    written = os.stat(manifest)
    assert syncdir.sync_dir(sftp, str(src), str(home), rules) == 0
    # a sync that changed nothing leaves the manifest as it was (not rewritten)
    now = os.stat(manifest)
    assert (now.st_ino, now.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    assert sorted(json.loads(manifest.read_text())["files"]) == ["helper.py", "main.py"]
    # a file the sync did not write is never overwritten, nor written through a symlink
    (src / ".bashrc").write_text("echo synced\n")
    (home / ".bashrc").write_text("echo the host's own\n")
    with pytest.raises(syncdir.SyncRefused, match="podlaunch did not write it"):
        syncdir.sync_dir(sftp, str(src), str(home), rules)
    assert (home / ".bashrc").read_text() == "echo the host's own\n"
    os.remove(src / ".bashrc")
    (tmp_path / "elsewhere").mkdir()
    (src / "data").mkdir()
    (src / "data" / "x.csv").write_text("1\n")
    os.symlink(tmp_path / "elsewhere", home / "data")
    with pytest.raises(syncdir.SyncRefused, match="not a directory"):
        syncdir.sync_dir(sftp, str(src), str(home), rules)
    assert os.listdir(tmp_path / "elsewhere") == []
    # a target that is the source itself, or contains it (a shared filesystem)
    with pytest.raises(syncdir.SyncRefused, match="shared filesystem"):
        syncdir.sync_dir(sftp, str(src), str(src), rules)
    with pytest.raises(syncdir.SyncRefused, match="shared filesystem"):
        syncdir.sync_dir(sftp, str(src), str(tmp_path), rules)
    # ... also where it already holds a manifest listing its own files as they are (it was
    # a sync's target from another machine once): the sync would change nothing, and is
    # refused all the same; nothing is written (the manifest neither)
    shutil.copytree(home / ".podlaunch", src / ".podlaunch")
    mine = json.loads(manifest.read_text())
    mine["files"] = {rel: {"source": os.path.realpath(src), "size": os.stat(src / rel).st_size,
                           "mtime": int(os.stat(src / rel).st_mtime)}
                     for rel in ("data/x.csv", "helper.py", "main.py")}
    mine["dirs"] = {"data": os.path.realpath(src)}
    (src / syncdir.MANIFEST).write_text(json.dumps(mine, sort_keys=True))
    before = (src / syncdir.MANIFEST).read_bytes()
    with pytest.raises(syncdir.SyncRefused, match="shared filesystem"):
        syncdir.sync_dir(sftp, str(src), str(src), rules)
    assert (src / syncdir.MANIFEST).read_bytes() == before
    assert sorted(os.listdir(src)) == sorted([".podlaunch", ".ssh", "data", "helper.py", "main.py"])


@pytest.mark.slow
def test_a_program_in_a_directory_with_keys_is_refused_before_any_host_is_touched(tmp_path, hosts):
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\n")
    (tmp_path / "p.py").write_text("print('hi')\n")
    home = tmp_path / "hosthome"
    spec = {"name": "keys", "program": {"argv": ["python", "p.py"]},
            "cluster": _cluster(tmp_path, hosts, hosts=[{"host": h, "workdir": str(home)}
                                                        for h in hosts.hosts])}
    (tmp_path / "j.yaml").write_text(yaml.safe_dump(spec))
    done = launch(str(tmp_path / "j.yaml"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "program.dir:" in done.stderr and ".ssh/" in done.stderr and ".aws/" in done.stderr
    assert "nothing was started" in done.stderr
    assert not home.exists()


@pytest.mark.slow
def test_revoked_host_keys_are_refused_and_ca_lines_said_to_be_unchecked(tmp_path, hosts):
    kind, blob = open(f"{hosts.host_key(1)}.pub").read().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(open(hosts.known_hosts).read() + f"@revoked * {kind} {blob}\n")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(_cluster(tmp_path, hosts, known_hosts_file=str(known),
                                               host_key_policy="accept-new")))
    done = launch("jobs/linear.yaml", "--cluster", str(cluster), "--dry-run")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "REVOKED HOST KEY DETECTED" in done.stderr and "127.0.0.3" in done.stderr, done.stderr
    ca = tmp_path / "known_hosts_ca"
    ca.write_text(f"@cert-authority * {kind} {blob}\n")
    cluster.write_text(yaml.safe_dump(_cluster(tmp_path, hosts, known_hosts_file=str(ca))))
    done = launch("jobs/linear.yaml", "--cluster", str(cluster), "--dry-run")
    assert done.returncode == 1
    assert "only @cert-authority lines match it" in done.stderr, done.stderr


def test_results_brought_back_are_never_written_through_a_link_in_the_run_directory(tmp_path, sftp):
    """The local run directory is input too: a link planted where process 0's tensorboard
    files or params land is refused, and what it points at is untouched."""
    remote = tmp_path / "remote-run"
    (remote / "tensorboard").mkdir(parents=True)
    (remote / "tensorboard" / "metrics.jsonl").write_text('{"step": 1}\n')
    (remote / "params.npz").write_bytes(b"params")
    local, victim = tmp_path / "local-run", tmp_path / "victim.txt"
    (local / "tensorboard").mkdir(parents=True)
    victim.write_text("the user's own\n")
    os.symlink(victim, local / "tensorboard" / "metrics.jsonl")
    with pytest.raises(OSError, match="is a symbolic link; podlaunch follows no link"):
        transfer.fetch_results(sftp, str(remote), str(local))
    os.remove(local / "tensorboard" / "metrics.jsonl")
    os.symlink(victim, local / "params.npz")
    assert transfer.fetch_results(sftp, str(remote), str(local)) == 1  # the params refused
    assert (local / "tensorboard" / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert victim.read_text() == "the user's own\n"


def test_the_syncs_temporaries_on_a_host_are_made_never_written_through_a_link(tmp_path, sftp):
    src, home, victim = tmp_path / "src", tmp_path / "home", tmp_path / "victim.txt"
    src.mkdir()
    (src / "main.py").write_text("print(1)\n")
    home.mkdir()
    victim.write_text("the host's own\n")
    os.symlink(victim, home / "main.py.sync.tmp")  # where the copy goes before its rename
    (home / ".podlaunch").mkdir()
    os.symlink(victim, home / ".podlaunch" / "synced.json.sync.tmp")
    assert syncdir.sync_dir(sftp, str(src), str(home)) == 1
    assert (home / "main.py").read_text() == "print(1)\n" and not os.path.islink(home / "main.py")
    assert victim.read_text() == "the host's own\n"
