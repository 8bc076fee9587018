"""The programs shipped to hosts (launcher/remote/), run here like any module, and as shipped.

Each program's ``main`` runs against real processes on this machine: a
sleeping process group for killpg and the survivor scan, a bound port for the
port check, a process holding a file open for the TPU holder scan. Then each
program's shipped source (proctl inlined) runs under ``python3 -I -c`` with
no access to this checkout, as it does on a host.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from harness.nosockets import SAID, python_json
from launcher import proctl, remote
from launcher.remote import holders, killpg, preflight, reach, wrapper

RUN_DIR_ENV = "PODLAUNCH_RUN_DIR"
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def sleeper(env=None, ignore_term=False, hold=None) -> subprocess.Popen:
    """A python that leads its own process group and sleeps (optionally ignoring TERM,
    optionally holding ``hold`` open) once it printed 'ready'."""
    code = "import signal, sys, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    if hold:
        code += f"f = open({hold!r}, 'a')\n"
    code += "print('ready', flush=True)\ntime.sleep(600)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **(env or {})},
                            start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def ended(proc, timeout_s=10.0):
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


# ---- killpg ------------------------------------------------------------------------
def test_killpg_signals_the_whole_group():
    proc = sleeper()
    try:
        out = killpg.main({"pgid": proc.pid, "signals": ["TERM", "CONT"]})
        assert ended(proc) == -signal.SIGTERM
        assert out["alive"] in ([], [proc.pid])  # signalled; the group may take a moment to go
    finally:
        proc.kill()


def test_killpg_with_wait_s_answers_once_the_killed_group_is_gone():
    """What a start that failed elsewhere asks of each host (``SshWorker.stop_unwatched``):
    the answer comes when no process of the group runs, not right after the signal."""
    procs = [sleeper(), sleeper()]
    try:  # several groups: all signalled, then one wait for all of them
        out = killpg.main({"pgids": [p.pid for p in procs], "signals": ["KILL"], "wait_s": 10})
        assert out["alive"] == [] and not any(proctl.group_members(p.pid) for p in procs)
        assert [ended(p) for p in procs] == [-signal.SIGKILL] * 2
    finally:
        for p in procs:
            p.kill()


def test_killpg_reports_stopped_groups_and_signals_several():
    """What the stall watchdog asks a host: which groups' leaders are stopped (state T)."""
    running, stopped = sleeper(), sleeper()
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while proctl.state(stopped.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        out = killpg.main({"pgids": [running.pid, stopped.pid], "signals": []})
        assert out["stopped"] == [stopped.pid] and sorted(out["alive"]) == sorted(
            proctl.group_members(running.pid) + proctl.group_members(stopped.pid))
        out = killpg.main({"pgids": [running.pid, stopped.pid], "signals": ["KILL"]})
        assert ended(running) == ended(stopped) == -signal.SIGKILL
    finally:
        running.kill()
        stopped.kill()


def test_reach_token_from_the_listener_only_and_it_ends_on_stdin_eof(tmp_path):
    port = proctl.free_port()
    listen = remote.python_call(SYSTEM_PYTHON, "reach", {
        "role": "listen", "port": port, "token": "t0k3n", "count": 3, "timeout_s": 30})
    listener = subprocess.Popen(listen, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    other = socket.socket()  # another program on another port: answers, but not the token
    other.bind(("127.0.0.1", 0))
    other.listen()
    try:
        assert remote.parse_marked(listener.stdout.readline(), reach.MARK) == {"listening": port}
        answer = _ship("reach", {"role": "connect", "address": f"127.0.0.1:{port}", "token": "t0k3n",
                                 "timeout_s": 5}, tmp_path)
        got = remote.parse_marked(answer.stdout, reach.MARK)
        assert {k: got[k] for k in ("ok", "resolved", "error")} == {
            "ok": True, "resolved": "127.0.0.1", "error": None}, answer.stderr
        # what gloo will advertise, and which network this is (the same machine and namespace)
        assert got["hostname"] == socket.gethostname()
        assert got["hostname_address"] == socket.getaddrinfo(socket.gethostname(), None)[0][4][0]
        assert got["network"] == reach.identity()["network"] and got["network"].endswith(
            "/%d" % os.stat("/proc/self/ns/net").st_ino)
        threading.Thread(target=lambda: (other.accept()[0].sendall(b"SSH-2.0-x\r\n")),
                         daemon=True).start()
        wrong = reach.connect({"role": "connect", "address": f"127.0.0.1:{other.getsockname()[1]}",
                               "token": "t0k3n", "timeout_s": 5})
        assert not wrong["ok"] and "another program answers there" in wrong["error"], wrong
        refused = reach.connect({"role": "connect", "address": f"127.0.0.1:{proctl.free_port()}",
                                 "token": "t0k3n", "timeout_s": 5})
        assert {k: refused[k] for k in ("ok", "resolved", "error")} == {
            "ok": False, "resolved": "127.0.0.1", "error": "connection refused"}
        assert listener.poll() is None  # 1 of 3 connections: still listening
        listener.stdin.close()  # the launcher closed the channel
        assert listener.wait(5) == 0
        assert proctl.bind_error(port) is None  # free again for the coordinator
    finally:
        listener.kill()
        other.close()


def test_a_listener_without_a_count_answers_any_number_until_stdin_ends(tmp_path):
    """The listener started during preflight (``count`` null): connections of other programs
    (a failed attempt's JAX client retrying the port) take no place of a host's check."""
    port = proctl.free_port()
    listener = subprocess.Popen(remote.python_call(SYSTEM_PYTHON, "reach", {
        "role": "listen", "port": port, "token": "t0k3n", "count": None, "timeout_s": 30}),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert remote.parse_marked(listener.stdout.readline(), reach.MARK) == {"listening": port}
        for _ in range(5):
            got = reach.connect({"address": f"127.0.0.1:{port}", "token": "t0k3n", "timeout_s": 5})
            assert got["ok"], got
        assert listener.poll() is None
        listener.stdin.close()
        assert listener.wait(5) == 0
    finally:
        listener.kill()


def test_preflight_reports_whole_second_mtimes_as_sftp_does(tmp_path, monkeypatch):
    """An mtime in the last nanoseconds of a second is that second (sftp-server's st_mtime),
    not the next one (a float rounded up): the sync's check compares the two."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".podlaunch").mkdir()
    (tmp_path / "a.py").write_text("x")
    os.utime(tmp_path / "a.py", ns=(1_700_000_000 * 10**9, 1_700_000_000 * 10**9 + 999_999_950))
    (tmp_path / ".podlaunch" / "synced.json").write_text(json.dumps({"files": {"a.py": {}}}))
    assert preflight.synced(".podlaunch/synced.json")["lstat"]["a.py"] == ["f", 1, 1_700_000_000]


def test_reach_listener_says_why_it_cannot_listen(capsys):
    held = socket.socket()
    held.bind(("", 0))
    held.listen()
    try:
        port = held.getsockname()[1]
        assert reach.listen({"port": port, "token": "x", "count": 1, "timeout_s": 1}) == 1
        said = remote.parse_marked(capsys.readouterr().out, reach.MARK)
        assert said["error"].startswith(f"cannot listen on port {port}: ") and "in use" in said["error"]
    finally:
        held.close()


def test_killpg_stop_sequence_kills_what_ignores_term():
    proc = sleeper(ignore_term=True)
    try:
        started = time.monotonic()
        out = killpg.main({"pgid": proc.pid, "grace_s": 0.5})
        assert ended(proc) == -signal.SIGKILL and out["alive"] == []
        assert time.monotonic() - started >= 0.5
        assert killpg.main({"pgid": proc.pid, "signals": ["KILL"]}) == {"alive": [], "stopped": []}  # gone: fine
    finally:
        proc.kill()


# ---- preflight ---------------------------------------------------------------------
def _record(state_dir, name, pgid, run_dir, node=None):
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / name
    path.write_text(json.dumps({"pgid": pgid, "run_dir": run_dir, "process_id": 2,
                                "node": node or socket.gethostname()}))
    return path


def test_preflight_finds_survivors_and_stops_them_only_when_asked(tmp_path):
    run_dir = str(tmp_path / "old-run")
    proc = sleeper(env={RUN_DIR_ENV: run_dir})
    other_node = sleeper(env={RUN_DIR_ENV: run_dir})
    state = tmp_path / "state"
    ours = _record(state, "process-002.pid", proc.pid, run_dir)
    _record(state, "process-003.pid", other_node.pid, run_dir, node="another-node")
    gone = _record(state, "process-004.pid", 999999, run_dir)  # no such group: removed
    reused = _record(state, "process-005.pid", other_node.pid, str(tmp_path / "other-run"))
    try:
        found = preflight.survivors(str(state), False, 1.0, RUN_DIR_ENV)
        assert [(r["pgid"], r["pids"], r.get("stopped")) for r in found] == [(proc.pid, [proc.pid], None)]
        assert proc.poll() is None and ours.exists()
        assert not gone.exists() and not reused.exists()  # its group lacks that run's marker
        found = preflight.survivors(str(state), True, 1.0, RUN_DIR_ENV)
        assert [(r["pgid"], r["pids"], r["stopped"]) for r in found] == [(proc.pid, [], True)]
        assert ended(proc) == -signal.SIGTERM and not ours.exists()
        assert other_node.poll() is None  # another node's record is never acted on
    finally:
        proc.kill()
        other_node.kill()


def test_a_restart_stops_only_its_own_runs_survivors(tmp_path):
    """``stop_own`` (a restart without --kill-stale): the failed attempt's processes of this
    run are stopped; another run's on the same host (a spare's, say) are reported, never
    stopped."""
    mine, theirs = str(tmp_path / "this-run"), str(tmp_path / "other-run")
    own, other = sleeper(env={RUN_DIR_ENV: mine}), sleeper(env={RUN_DIR_ENV: theirs})
    state = tmp_path / "state"
    _record(state, "process-000.pid", own.pid, mine)
    _record(state, "process-001.pid", other.pid, theirs)
    try:
        found = preflight.survivors(str(state), False, 1.0, RUN_DIR_ENV, mine, stop_own=True)
        by_dir = {r["run_dir"]: r for r in found}
        assert by_dir[mine]["stopped"] and by_dir[mine]["pids"] == []
        assert not by_dir[theirs].get("stopped") and by_dir[theirs]["pids"] == [other.pid]
        assert ended(own) == -signal.SIGTERM and other.poll() is None
    finally:
        own.kill()
        other.kill()


def test_runs_whose_local_directories_share_a_name_get_their_own_on_the_hosts(tmp_path):
    """Third attack on issue 28, F1: ``--run-dir a/run`` and ``--run-dir b/run`` were both
    ``<workdir>/runs/<job>/run`` on a host, so one run's restart stopped the other's workers
    as its own. Each run directory has its own remote name; one run's attempts, its
    ``--resume`` and a path through a symlink to it keep one."""
    from launcher.plan import remote_run_name
    from types import SimpleNamespace

    from launcher.backends.ssh.hosts import placements

    a, b = tmp_path / "a" / "run", tmp_path / "b" / "run"
    a.mkdir(parents=True)
    os.symlink(a, tmp_path / "link")
    assert remote_run_name(str(a)) != remote_run_name(str(b))
    assert remote_run_name(str(a)).startswith("run-") and len(remote_run_name(str(a))) == 12
    assert remote_run_name(str(a)) == remote_run_name(str(tmp_path / "link")) \
        == remote_run_name(str(a) + "/")

    job = SimpleNamespace(name="linear", local_device_count=2, cluster=SimpleNamespace(platform="cpu"))
    settings = SimpleNamespace(python="python3", env={})
    host = SimpleNamespace(name="h", workdir="/w", num_processes=1)
    dirs = [placements(job, settings, [host], str(d))[0].run_dir for d in (a, b)]
    assert dirs == [f"/w/runs/linear/{remote_run_name(str(d))}" for d in (a, b)]


def test_a_free_port_is_below_the_ephemeral_range_and_free_on_both_families():
    # The CI failure this guards: a bind(0) port lies in the kernel's ephemeral range, an
    # outgoing connection took it before JAX bound [::]:PORT ("Failed to add port to server")
    low, high = proctl.ephemeral_range()
    ports = {proctl.free_port("127.0.0.1") for _ in range(20)}
    assert all(1024 <= p < low for p in ports) and len(ports) > 1
    port = ports.pop()
    # a listener on the IPv6 loopback alone makes the port unusable for a [::] bind
    with socket.socket(socket.AF_INET6) as taken:
        taken.bind(("::1", port))
        taken.listen()
        assert proctl.bind_error(port, "127.0.0.1").startswith(f"port {port} is in use")
    assert proctl.bind_error(port, "127.0.0.1") is None


def test_preflight_reports_versions_modules_and_port(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = {"modules": ["json", "no_such_module_here"], "port": port, "kill_stale": False,
                "grace_s": 1, "state_dir": str(tmp_path / "none"), "run_dir_env": RUN_DIR_ENV}
        out = preflight.main(args)
    assert out["port_error"].startswith(f"port {port} is in use")
    assert out["missing_modules"] == ["no_such_module_here"]
    assert out["workdir"] == str(tmp_path) and out["survivors"] == []
    assert set(out) >= {"python", "jax", "jaxlib"}
    assert remote.parse_marked(capsys.readouterr().out, preflight.MARK) == out
    free = preflight.main({**args, "port": 0})
    assert "port_error" not in free and proctl.bind_error(free["port"]) is None
    assert "port" not in preflight.main({**args, "port": None})


@pytest.mark.parametrize("errno_name", sorted(SAID))
def test_preflight_on_a_host_without_tcp_sockets_says_so_not_in_use(tmp_path, errno_name):
    # bind_error read every errno as "in use" (EPERM: "port 23456 is in use (Operation not
    # permitted)") and free_port's traceback ended the preflight program without its line
    said = {"port_error": f"cannot be had: this host allows no TCP socket ({SAID[errno_name]})"}
    assert python_json(tmp_path, errno_name, (
        "import json; from launcher.remote import preflight; "
        "print(json.dumps([preflight.check_port(23456), preflight.check_port(0)]))")) == [said] * 2


# ---- wrapper -----------------------------------------------------------------------
def test_wrapper_leads_a_group_records_it_and_reports_the_exit(tmp_path, capfd):
    pid_file = tmp_path / "state" / "process-000.pid"
    check = ("import json, os, sys; r = json.load(open(sys.argv[1])); "
             "assert r['pgid'] == os.getpgid(0) == os.getpid(), r; print('worker ran'); sys.exit(3)")
    code = wrapper.main({"argv": [sys.executable, "-c", check, str(pid_file)],
                         "pid_file": str(pid_file), "run_dir": str(tmp_path / "run"),
                         "process_id": 0})
    out = capfd.readouterr().out.splitlines()
    assert code == 3 and (tmp_path / "run").is_dir() and not pid_file.exists()
    assert out[0].startswith(wrapper.PGID_MARK) and "worker ran" in out
    assert out[-1].startswith(wrapper.EXIT_MARK)
    code_, sig, at = wrapper.parse_exit_report(out[-1][len(wrapper.EXIT_MARK):])
    assert (code_, sig) == (3, None) and abs(at - time.time()) < 60


def test_wrapper_reports_a_signal_death(tmp_path, capfd):
    code = wrapper.main({"argv": [sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"],
                         "pid_file": str(tmp_path / "p.pid"), "run_dir": str(tmp_path), "process_id": 1})
    last = capfd.readouterr().out.splitlines()[-1]
    assert code == 137
    assert wrapper.parse_exit_report(last[len(wrapper.EXIT_MARK):])[:2] == (None, signal.SIGKILL)


# ---- holders -----------------------------------------------------------------------
def test_holders_found_stopped_when_asked_and_lockfile_removed_when_free(tmp_path):
    device, lockfile = tmp_path / "accel0", tmp_path / "libtpu_lockfile"
    device.write_text("")
    holder = sleeper(env={RUN_DIR_ENV: "/r/old"}, hold=str(device))
    args = {"globs": [str(tmp_path / "accel*")], "lockfile": str(lockfile), "stop_others": False,
            "dry_run": False, "grace_s": 0.5, "port": None, "run_dir_env": RUN_DIR_ENV}
    try:
        out = holders.main(args)
        assert [(h["pid"], h["paths"], h["podlaunch_run_dir"]) for h in out["holders"]] == \
            [(holder.pid, [str(device)], "/r/old")]
        assert out["stopped"] == [] and holder.poll() is None
        lockfile.write_text("")
        dry = holders.main({**args, "stop_others": True, "dry_run": True})
        assert dry["lockfile"] == "stale" and lockfile.exists() and holder.poll() is None
        out = holders.main({**args, "stop_others": True})
        assert out["stopped"] == [holder.pid] and out["holders"] == []
        assert ended(holder) is not None
        assert out["lockfile"] == "removed" and not lockfile.exists()
    finally:
        holder.kill()


def test_a_held_lockfile_stays_and_a_taken_port_is_reported(tmp_path):
    lockfile = tmp_path / "libtpu_lockfile"
    lockfile.write_text("")
    holder = sleeper(hold=str(lockfile))
    try:
        with socket.socket() as taken:
            taken.bind(("", 0))
            taken.listen()
            out = holders.main({"globs": [], "lockfile": str(lockfile), "stop_others": False,
                                "dry_run": False, "grace_s": 0.5, "port": taken.getsockname()[1],
                                "run_dir_env": RUN_DIR_ENV})
        assert out["lockfile"] == "held" and lockfile.exists()
        assert "is in use" in out["port_error"]
    finally:
        holder.kill()


# ---- as shipped ----------------------------------------------------------------------
@pytest.mark.parametrize("name", remote.PROGRAMS)
def test_shipped_source_is_self_contained_python_3_8(name):
    text = remote.source(name)
    compile(text, name, "exec")
    calls = [n for n in ast.walk(ast.parse(text))
             if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "compile"]
    inlined = [call.args[0].value for call in calls]  # proctl's text, loaded as its own module
    with open(os.path.join(os.path.dirname(remote.__file__), name + ".py")) as f:
        assert len(inlined) == (remote.IMPORT_PROCTL in f.read())  # once where it is imported
    for code in (text, *inlined):
        # feature_version: the grammar checks of Python 3.8 that ast offers (best effort; the
        # run under python3 -c below covers the rest on this machine's python)
        tree = ast.parse(code, feature_version=(3, 8))
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert not [n for n in imports if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
        assert not [n for n in imports if (getattr(n, "module", None) or "").startswith("launcher")
                    or any(a.name.startswith("launcher") for a in n.names)]


def _ship(name, args, tmp_path, timeout_s=30):
    """Run program ``name`` as a host does: ``python3 -I -c SOURCE JSON``, outside this checkout."""
    argv = remote.python_call(SYSTEM_PYTHON, name, args)
    argv.insert(1, "-I")  # isolated: no PYTHONPATH, no user site, no current directory
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=timeout_s,
                          env={"PATH": os.environ["PATH"]})


def test_shipped_programs_run_under_python3_c(tmp_path):
    proc = sleeper()
    try:
        done = _ship("killpg", {"pgid": proc.pid, "grace_s": 1}, tmp_path)
        assert done.returncode == 0, done.stderr
        assert remote.parse_marked(done.stdout, killpg.MARK) == {"alive": [], "stopped": []}
        assert ended(proc) is not None
    finally:
        proc.kill()
    done = _ship("preflight", {"modules": ["json"], "port": 0, "kill_stale": False, "grace_s": 1,
                               "state_dir": ".podlaunch/x", "run_dir_env": RUN_DIR_ENV}, tmp_path)
    facts = remote.parse_marked(done.stdout, preflight.MARK)
    assert done.returncode == 0 and facts["missing_modules"] == [] and facts["port"] > 0, done.stderr
    assert facts["workdir"] == str(tmp_path)
    done = _ship("holders", {"globs": [str(tmp_path / "none*")], "lockfile": str(tmp_path / "lock"),
                             "stop_others": False, "dry_run": True, "grace_s": 1, "port": None,
                             "run_dir_env": RUN_DIR_ENV}, tmp_path)
    assert remote.parse_marked(done.stdout, holders.MARK)["holders"] == [], done.stderr
    done = _ship("wrapper", {"argv": ["sh", "-c", "echo hi; exit 4"], "pid_file": "state/p.pid",
                             "run_dir": "run", "process_id": 0}, tmp_path)
    lines = done.stdout.splitlines()
    assert done.returncode == 4 and "hi" in lines and lines[0] != "podlaunch-exit", done.stderr
    assert wrapper.parse_exit_report(lines[-1][len(wrapper.EXIT_MARK):])[:2] == (4, None)


def test_a_wrapper_killed_takes_its_worker_with_it(tmp_path):
    # issue 51.2: the wrapper SIGKILLed on one host left its worker (its own session)
    # training on unsupervised to the end
    argv = remote.python_call(SYSTEM_PYTHON, "wrapper", {
        "argv": [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)"],
        "pid_file": None, "run_dir": "run", "process_id": 0})
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                            env={"PATH": os.environ["PATH"]})
    worker_pid, ready = None, False
    try:
        for line in proc.stdout:  # the pgid line and the worker's, in either order (two writers)
            if line.startswith(wrapper.PGID_MARK):
                worker_pid = int(line.split()[-1])
            elif line.strip() == "ready":
                ready = True
            if ready and worker_pid is not None:
                break
        assert worker_pid is not None
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 30  # generous: only a loaded machine takes long
        while _alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker_pid), "the worker outlived its wrapper"
    finally:
        proc.kill()
        if worker_pid is not None and _alive(worker_pid):
            os.kill(worker_pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper is no longer running)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def test_source_refuses_a_program_that_imports_more_of_launcher(tmp_path, monkeypatch):
    (tmp_path / "killpg.py").write_text("from launcher import proctl\nfrom launcher import plan\n")
    monkeypatch.setattr(remote, "_HERE", str(tmp_path))
    remote.source.cache_clear()
    try:
        with pytest.raises(ValueError, match="'from launcher import plan' cannot run on a host"):
            remote.source("killpg")
        with pytest.raises(ValueError, match="no remote program 'nope'"):
            remote.source("nope")
    finally:
        remote.source.cache_clear()


def test_a_tilde_workdir_is_the_login_home_not_a_directory_named_tilde(tmp_path):
    """issue 12, kind 2: the remote script expands ~ and ~/... as OpenSSH and scp users expect."""
    from launcher.backends.ssh.hostscript import remote_path, shell_script

    home = tmp_path / "home"
    home.mkdir()
    for workdir, want in [("~/x y/z", home / "x y" / "z"), ("~", home), ("rel", home / "rel")]:
        script = shell_script(workdir, (), {}, ["pwd"])
        done = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True,
                              cwd=str(home), env={"HOME": str(home), "PATH": os.environ["PATH"]})
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(want)
    assert not (home / "~").exists()
    assert remote_path("~user/x") == "'~user/x'"  # only the login user's home is expanded


# ---- known_hosts, read once for every host's check ----------------------------------
def test_known_hosts_is_parsed_once_and_every_host_finds_its_own_keys_in_file_order(tmp_path):
    """issue 29: each host's check parsed the whole known_hosts again (N hosts: N x N
    lines). Plain names are found by name, patterns and hashes line by line, as before;
    an append (accept-new) is seen."""
    import paramiko

    from launcher.backends.ssh import hostkeys

    made = [paramiko.RSAKey.generate(1024) for _ in range(3)]
    path = tmp_path / "known_hosts"
    lines = [f"[127.0.0.{i}]:2222 {made[0].get_name()} {made[0].get_base64()}" for i in range(2, 200)]
    lines.append(f"[127.0.0.7]:2222,Other {made[1].get_name()} {made[1].get_base64()}")
    lines.append(f"[127.0.0.*]:2222,![127.0.0.9]:2222 {made[2].get_name()} {made[2].get_base64()}")
    lines.append(f"@revoked [127.0.0.8]:2222 {made[1].get_name()} {made[1].get_base64()}")
    hashed = paramiko.HostKeys.hash_host("[127.0.0.250]:2222")
    lines.append(f"{hashed} {made[1].get_name()} {made[1].get_base64()}")
    path.write_text("\n".join(lines) + "\n")
    f = str(path)
    assert hostkeys.known_keys(f, "[127.0.0.7]:2222") == [made[0], made[1], made[2]]
    parsed = hostkeys._parsed[f]
    assert hostkeys.known_keys(f, "other") == [made[1]]  # names are case-insensitive
    assert hostkeys.known_keys(f, "[127.0.0.9]:2222") == [made[0]]  # negated by the pattern
    assert hostkeys.known_keys(f, "[127.0.0.8]:2222", "@revoked") == [made[1]]
    assert hostkeys.known_keys(f, "[127.0.0.250]:2222") == [made[2], made[1]]
    assert hostkeys.known_keys(f, "nobody") == []
    assert hostkeys._parsed[f] is parsed  # not parsed again
    with open(f, "a") as out:
        out.write(f"nobody {made[1].get_name()} {made[1].get_base64()}\n")
    assert hostkeys.known_keys(f, "nobody") == [made[1]]
