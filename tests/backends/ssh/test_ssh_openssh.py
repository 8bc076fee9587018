"""SSH as OpenSSH users know it (issue 12, items 10-12 and 14), on real sshd hosts.

Each case is checked against OpenSSH itself where it can be: the real ``ssh``
client with the same files must agree (connect, or refuse), and ``ssh -G``
prints the config OpenSSH resolved. After every fault the process table is
read: what the run started on each host (processes whose PODLAUNCH_RUN_DIR is
that host's remote run dir) must be gone, and a host that should not have been
contacted has no new login in its sshd log.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

import pytest
import yaml

from harness import sshenv
from harness.helpers import launch
from test_ssh import NUM_HOSTS, SHORT, survivors, write_cluster

THREE = ("--set", "train.global_batch_size=24", "--set", "data.num_examples=24")


@pytest.fixture
def hosts(ssh_hosts):
    """The session's four sshd hosts (tests/conftest.py), restored after the test."""
    return ssh_hosts


def logins(ssh_env, i: int) -> int:
    """Logins host ``i``'s sshd has accepted so far (its log, LogLevel VERBOSE)."""
    return ssh_env.log_file(i).read_text().count("Accepted publickey")


def openssh_connects(ssh_env, config: str, host: str) -> bool:
    """Whether the real ssh client, with ``config``, logs in to ``host`` and runs ``true``."""
    r = subprocess.run(["ssh", "-F", config, "-o", "BatchMode=yes", host, "true"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    return r.returncode == 0


def public_line(path, name: str) -> str:
    kind, blob = open(f"{path}.pub").read().split()[:2]
    return f"{name} {kind} {blob}\n"


def config_with(ssh_env, tmp_path, known_hosts: str) -> str:
    """The env's ssh_config, with ``known_hosts`` as UserKnownHostsFile."""
    text = open(ssh_env.ssh_config).read().replace(ssh_env.known_hosts, known_hosts)
    path = tmp_path / "ssh_config"
    path.write_text(text)
    return str(path)


# ---- 12: several host key types -------------------------------------------------------
@pytest.mark.slow
def test_a_host_with_several_key_types_is_checked_per_type_as_openssh_does(tmp_path, hosts):
    """Host 1 has RSA, ECDSA and ED25519 host keys. known_hosts with an old (wrong) RSA key
    and its right ECDSA key: OpenSSH connects, so does podlaunch. A wrong ECDSA key: both
    refuse, as CHANGED. The right key only in a GlobalKnownHostsFile: both connect. Only a
    key of a type the host lacks: unknown, not changed."""
    hosts.set_host_key_kinds(1, ("rsa", "ecdsa", "ed25519"))
    name = f"[{hosts.hosts[1]}]:{hosts.port}"
    others = [line for line in open(hosts.known_hosts) if not line.startswith(name)]
    old_rsa = tmp_path / "old_rsa"
    sshenv._keygen(old_rsa, "old", "rsa")
    wrong_ecdsa = tmp_path / "wrong_ecdsa"
    sshenv._keygen(wrong_ecdsa, "wrong", "ecdsa")
    known = tmp_path / "known_hosts"
    config = config_with(hosts, tmp_path, str(known))

    known.write_text("".join(others) + public_line(old_rsa, name)
                     + public_line(hosts.host_key(1, "ecdsa"), name))
    assert openssh_connects(hosts, config, hosts.hosts[1])
    result = launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, hosts, ssh_config_file=config),
                    "--dry-run", *SHORT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "preflight ok on 4 hosts" in result.stdout

    known.write_text("".join(others) + public_line(wrong_ecdsa, name))
    assert not openssh_connects(hosts, config, hosts.hosts[1])
    before = logins(hosts, 1)
    result = launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, hosts, ssh_config_file=config),
                    *SHORT, "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"127\.0\.0\.3\s+p1\s+host key CHANGED: the ecdsa-sha2-nistp256 key sent by the host",
                     result.stderr), result.stderr
    assert logins(hosts, 1) == before and not survivors(tmp_path, tmp_path / "run", 0)

    # a key in a GlobalKnownHostsFile (e.g. /etc/ssh/ssh_known_hosts) counts, as for ssh
    known.write_text("".join(others))
    global_known = tmp_path / "global_known_hosts"
    global_known.write_text(public_line(hosts.host_key(1, "ecdsa"), name))
    text = open(config).read()
    open(config, "w").write(text.replace("GlobalKnownHostsFile /dev/null",
                                         f"GlobalKnownHostsFile {global_known}"))
    assert openssh_connects(hosts, config, hosts.hosts[1])
    result = launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, hosts, ssh_config_file=config),
                    "--dry-run", *SHORT)
    assert result.returncode == 0, result.stdout + result.stderr
    global_known.write_text("")

    hosts.set_host_key_kinds(1, ("ed25519",))  # the host has no RSA key: an RSA line is no verdict
    known.write_text("".join(others) + public_line(old_rsa, name))
    assert not openssh_connects(hosts, config, hosts.hosts[1])
    result = launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, hosts, ssh_config_file=config),
                    "--dry-run", *SHORT)
    assert result.returncode == 1
    assert re.search(r"127\.0\.0\.3\s+p1\s+unknown host key \(no ssh-ed25519 key for .* \(it has ssh-rsa "
                     r"for it\)\); add it", result.stderr), result.stderr
    assert "CHANGED" not in result.stderr


# ---- 11: ProxyJump ------------------------------------------------------------------------
def jump_config(ssh_env, tmp_path, bastion_known_hosts: str) -> str:
    """ssh_config: host 0 is ``bastion`` (its key checked against ``bastion_known_hosts``);
    hosts 1-3 are reached through it."""
    common = (f"    User {ssh_env.user}\n    Port {ssh_env.port}\n"
              f"    IdentityFile {ssh_env.identity_file}\n    IdentitiesOnly yes\n"
              "    GlobalKnownHostsFile /dev/null\n    StrictHostKeyChecking yes\n"
              "    BatchMode yes\n    ConnectTimeout 5\n    LogLevel ERROR\n")
    path = tmp_path / "jump_config"
    path.write_text(f"Host bastion\n    HostName {ssh_env.hosts[0]}\n"
                    f"    UserKnownHostsFile {bastion_known_hosts}\n{common}"
                    f"Host {' '.join(ssh_env.hosts[1:])}\n    ProxyJump bastion\n"
                    f"    UserKnownHostsFile {ssh_env.known_hosts}\n{common}")
    return str(path)


def behind_the_bastion(tmp_path, ssh_env, config: str) -> str:
    cluster = write_cluster(tmp_path, ssh_env, ssh_config_file=config)
    raw = yaml.safe_load(open(cluster))
    raw["hosts"] = raw["hosts"][1:]
    open(cluster, "w").write(yaml.safe_dump(raw))
    return cluster


@pytest.mark.slow
def test_every_proxyjump_hop_is_checked_like_the_target(tmp_path, hosts):
    """Hosts 1-3 behind bastion host 0. Its key not in its known_hosts (strict), or changed:
    OpenSSH refuses; podlaunch refuses too, naming the jump host, and nothing logs in to a
    target or starts there. With the bastion's key known the job runs through it."""
    bastion_known = tmp_path / "bastion_known_hosts"
    bastion_known.write_text("")
    config = jump_config(hosts, tmp_path, str(bastion_known))
    cluster = behind_the_bastion(tmp_path, hosts, config)
    bastion = f"[{hosts.hosts[0]}]:{hosts.port}"
    for case, known in [("unknown", ""), ("changed", None)]:
        if known is None:
            wrong = tmp_path / "wrong_key"
            sshenv._keygen(wrong, "wrong")
            known = public_line(wrong, bastion)
        bastion_known.write_text(known)
        assert not openssh_connects(hosts, config, hosts.hosts[1]), case
        before = [logins(hosts, i) for i in range(NUM_HOSTS)]
        run_dir = tmp_path / f"run-{case}"
        result = launch("jobs/linear.yaml", "--cluster", cluster, *SHORT, *THREE, "--run-dir", str(run_dir))
        assert result.returncode == 1, result.stdout + result.stderr
        why = ("unknown host key \\(no ssh-ed25519 key for " if case == "unknown"
               else "host key CHANGED: the ssh-ed25519 key")
        for i, host in enumerate(hosts.hosts[1:]):
            assert re.search(rf"{re.escape(host)}\s+p{i}\s+jump host bastion \({re.escape(hosts.hosts[0])}:"
                             rf"{hosts.port}\): {why}", result.stderr), result.stderr
        assert [logins(hosts, i) for i in range(NUM_HOSTS)] == before  # no one logged in anywhere
        assert not survivors(tmp_path, run_dir, 0) and not (run_dir / "logs").exists()

    bastion_known.write_text(open(hosts.known_hosts).readlines()[0])  # the bastion's right key
    assert openssh_connects(hosts, config, hosts.hosts[1])
    before = logins(hosts, 0)
    run_dir = tmp_path / "run-ok"
    result = launch("jobs/linear.yaml", "--cluster", cluster, *SHORT, *THREE, "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: 3 processes succeeded" in result.stdout
    assert logins(hosts, 0) >= before + 3  # every target was reached through the bastion
    assert not survivors(tmp_path, run_dir, 5)


@pytest.mark.slow
def test_through_a_proxycommand_the_target_s_key_is_still_checked(tmp_path, hosts):
    """``ProxyCommand ssh -W %h:%p bastion``: the job reaches the targets through it, and a
    target whose key changed is refused, as OpenSSH refuses it."""
    config = jump_config(hosts, tmp_path, hosts.known_hosts)
    text = open(config).read().replace(
        "    ProxyJump bastion\n", f"    ProxyCommand ssh -F {config} -W %h:%p bastion\n")
    open(config, "w").write(text)
    cluster = behind_the_bastion(tmp_path, hosts, config)
    before = logins(hosts, 0)
    result = launch("jobs/linear.yaml", "--cluster", cluster, "--dry-run", *SHORT, *THREE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert logins(hosts, 0) >= before + 3  # each target through the bastion
    hosts.regenerate_host_key(2)
    assert not openssh_connects(hosts, config, hosts.hosts[2])
    result = launch("jobs/linear.yaml", "--cluster", cluster, "--dry-run", *SHORT, *THREE)
    assert result.returncode == 1
    assert re.search(r"127\.0\.0\.4\s+p1\s+host key CHANGED", result.stderr), result.stderr
    assert not survivors(tmp_path, tmp_path / "run", 0)


# ---- 14: very long output lines -------------------------------------------------------------
@pytest.mark.slow
def test_a_100_mb_line_without_a_newline_passes_whole_to_the_log_and_shortened_to_the_console(
        tmp_path, hosts):
    """p1 prints 100 MiB of "x" without a newline and exits 7 (the launcher's keepalive
    timeout is 4 s, far less than the line takes to pass): its host is not lost, the
    failure is its exit code, the console and summary hold a head of the line and its
    length, the log file every byte, and nothing of the run is left on any host."""
    run_dir = tmp_path / "run"
    size = 100 << 20
    result = launch("jobs/linear.yaml", "--cluster", write_cluster(tmp_path, hosts),
                    "--set", "train.num_steps=50", "--set", "task.name=faulty_task:make",
                    "--set", "task.args.crash_at_step=3", "--set", "task.args.crash_process_id=1",
                    "--set", "task.args.mode=long_line", "--run-dir", str(run_dir), timeout_s=300)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-5000:]
    assert re.search(r"^FAILED: process_id 1 on 127\.0\.0\.3 \(exit code 7\)", result.stdout, re.M), out[-5000:]
    assert "lost" not in out
    assert f"{'x' * 2000} [... line cut: {size:,} characters in all, every one in the log file]" in out
    assert len(out) < 100_000
    log = run_dir / "logs" / "process-001.log"
    with open(log, "rb") as f:
        data = f.read()
    start = data.index(b"x" * 1000)
    assert data[start:start + size + 1] == b"x" * size + b"\n"  # every byte, and the line ended
    assert not survivors(tmp_path, run_dir)


# ---- 10: ssh_config as OpenSSH reads it ------------------------------------------------------
def openssh_resolves(config: str, name: str) -> dict:
    """``ssh -F config -G name``: the options OpenSSH would use (the oracle)."""
    out = subprocess.run(["ssh", "-F", config, "-G", name], capture_output=True, text=True,
                         check=True, stdin=subprocess.DEVNULL).stdout
    options: dict = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        options.setdefault(key, []).append(value)
    return options


@pytest.fixture
def ssh_client():
    if shutil.which("ssh") is None:
        if sshenv.in_ci():
            pytest.fail("CI=true and there is no ssh client here", pytrace=False)
        pytest.skip(sshenv.UNAVAILABLE + "needs the OpenSSH client (ssh)")


def test_ssh_config_resolves_as_ssh_G_says(tmp_path, ssh_client):
    """Include (absolute, glob, relative to ~/.ssh, inside a Host block), Host patterns with
    ``!`` and with ``[`` (a class to fnmatch, not to OpenSSH), Match host / originalhost,
    %h in HostName, first value wins:
    every host's HostName, User, Port, ConnectTimeout, known_hosts file, policy, ProxyJump
    and IdentityFile are what ``ssh -G`` prints for it."""
    from launcher.backends.ssh import hosts as ssh_hosts
    from launcher.backends.ssh.settings import SshHost, SshSettings

    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("id_a", "id_star", "id_cond"):
        (keys / name).write_text("")
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "10-a.conf").write_text("Host inc-a\n  HostName 10.1.1.1\n  Port 2201\n")
    (inc / "20-b.conf").write_text("Host inc-b\n  User bee\nHost inc-*\n  ConnectTimeout 9\n")
    (inc / "cond.conf").write_text(f"User conduser\nIdentityFile {keys}/id_cond\n"
                                   "Host cond-never\n  HostName 10.9.9.9\n")
    home_ssh = os.path.expanduser("~/.ssh")
    rel_dir = tempfile.mkdtemp(prefix="podlaunch-test-", dir=os.makedirs(home_ssh, exist_ok=True) or home_ssh)
    try:
        with open(os.path.join(rel_dir, "rel.conf"), "w") as f:
            f.write("Host rel-host\n  HostName 10.2.2.2\n  StrictHostKeyChecking accept-new\n")
        config = tmp_path / "config"
        config.write_text(
            f"Include {inc}/[0-9]*.conf\n"
            f"Include {os.path.basename(rel_dir)}/rel.conf\n"          # relative: ~/.ssh/...
            "Host cond-*\n"
            f"  Include {inc}/cond.conf\n"
            "  Port 2299\n"                                            # still under cond-*
            "Host node[12]\n  HostName 10.3.3.3\n"
            "Host *.lan !secret.lan\n  User lanuser\n  ProxyJump jumper\n"
            "Host jumper\n  HostName 10.4.4.4\n  UserKnownHostsFile /tmp/kh-jumper\n"
            "Match originalhost tok-*\n  HostName %h.example.com\n"
            "Match host 10.3.*\n  User matched\n"
            "Host *\n"
            f"  IdentityFile {keys}/id_star\n  User default-user\n  ConnectTimeout 4\n"
            f"  UserKnownHostsFile {tmp_path}/kh-all\n  StrictHostKeyChecking yes\n")
        names = ["inc-a", "inc-b", "rel-host", "cond-x", "node1", "box.lan", "secret.lan",
                 "tok-1", "plain"]
        settings = SshSettings(ssh_config_file=str(config))
        resolved = ssh_hosts.resolve(settings, [SshHost(host=n) for n in names], [1] * len(names),
                                     "c.yaml")
        for name, host in zip(names, resolved):
            want = openssh_resolves(str(config), name)
            c = host.connection
            got = {"hostname": c.host, "user": c.user, "port": str(c.port),
                   "connecttimeout": str(c.connect_timeout),
                   "userknownhostsfile": host.known_hosts_file,
                   "also read": list(host.also_known_hosts),
                   "stricthostkeychecking": host.host_key_policy,
                   "proxyjump": c.gateway.original_host if c.gateway else "none",
                   "identityfile": [f for f in c.connect_kwargs.get("key_filename", [])
                                    if os.path.exists(f)]}
            expected = {"hostname": want["hostname"][0], "user": want["user"][0],
                        "port": want["port"][0], "connecttimeout": want["connecttimeout"][0],
                        "userknownhostsfile": want["userknownhostsfile"][0].split()[0],
                        "also read": want["userknownhostsfile"][0].split()[1:]
                        + want["globalknownhostsfile"][0].split(),
                        "stricthostkeychecking": {"true": "strict"}.get(
                            want["stricthostkeychecking"][0], want["stricthostkeychecking"][0]),
                        "proxyjump": want.get("proxyjump", ["none"])[0],
                        "identityfile": [os.path.expanduser(f) for f in want["identityfile"]
                                         if os.path.exists(os.path.expanduser(f))]}
            assert got == expected, name
        # the cases above are not vacuous: what OpenSSH made of them
        by_name = dict(zip(names, resolved))
        assert by_name["inc-a"].connection.host == "10.1.1.1" and by_name["inc-a"].connection.port == 2201
        assert by_name["rel-host"].host_key_policy == "accept-new"
        assert (by_name["cond-x"].connection.user, by_name["cond-x"].connection.port) == ("conduser", 2299)
        assert by_name["node1"].connection.host == "node1"  # no [] classes in OpenSSH patterns (fnmatch has them)
        assert by_name["box.lan"].connection.gateway.host == "10.4.4.4"
        assert by_name["secret.lan"].connection.gateway is None
        assert by_name["tok-1"].connection.host == "tok-1.example.com"
        # the jump host's own known_hosts file is the one its hop is checked with
        hop = by_name["box.lan"].connection.gateway
        assert by_name["box.lan"].hop_check(hop).known_hosts_file == "/tmp/kh-jumper"
    finally:
        shutil.rmtree(rel_dir)


def test_names_of_one_host_class_are_asked_twice_and_each_gets_what_ssh_G_says(tmp_path, ssh_client):
    """Issue 29: ``ssh -G`` per host was most of the launcher's CPU per host. Names that
    match the same Host lines (an Included file's, ``!`` patterns, upper case, ProxyJump
    hops) are asked twice per class; a class whose answers carry the name (``%h`` in
    HostName or UserKnownHostsFile) is asked name by name; a literal HostName is shared.
    Every name's options are what ``ssh -G`` prints for it, and a Match line anywhere
    sends every name to ``ssh -G``."""
    from launcher.backends.ssh import sshconfig

    (tmp_path / "inc.conf").write_text("Host inc-*\n  Port 2201\n")
    config = tmp_path / "config"
    config.write_text(
        f"Include {tmp_path}/inc.conf\n"
        "Host lit-*\n  HostName 10.9.9.9\n"
        "Host tok-*\n  HostName %h.corp\n"
        "Host kh-*\n  UserKnownHostsFile /tmp/kh-%h\n"
        "Host *.lan !secret.lan\n  User lanuser\n  ProxyJump jumper\n"
        "Host jumper\n  HostName 10.4.4.4\n"
        "Host *\n  User default-user\n  ConnectTimeout 4\n")
    calls = tmp_path / "calls"
    ssh = tmp_path / "ssh"  # the real client, each call written down
    ssh.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nexec {shutil.which('ssh')} \"$@\"\n")
    ssh.chmod(0o755)
    names = ([f"{prefix}{i}" for prefix in ("inc-", "lit-", "tok-", "kh-", "plain", "UP") for i in range(4)]
             + ["a.lan", "b.lan", "c.lan", "secret.lan", "10.0.0.1", "10.0.0.2"])
    got = sshconfig.resolve_with_openssh(names, str(config), "c.yaml", ssh=str(ssh))
    assert set(got) == set(names) | {"jumper"}
    for name in got:
        want = openssh_resolves(str(config), name)
        assert got[name]["hostname"] == want["hostname"][0], name
        for key in ("user", "port", "connecttimeout", "userknownhostsfile", "proxyjump"):
            assert got[name].get(key, "none") == want.get(key, ["none"])[0], (name, key)
    asked = [line.split()[-1] for line in calls.read_text().splitlines()]
    assert sorted(asked) == sorted(set(asked))
    # two per class (inc, lit, *.lan, the 11 that match only Host *: secret.lan is one), every
    # tok- and kh- name, and the hop jumper
    assert len(asked) == 2 + 2 + 2 + 2 + 4 + 4 + 1, asked
    assert {f"tok-{i}" for i in range(4)} | {f"kh-{i}" for i in range(4)} <= set(asked)
    assert got["lit-3"]["hostname"] == "10.9.9.9" and got["UP3"]["hostname"] == "up3"
    assert got["c.lan"]["proxyjump"] == "jumper" and got["secret.lan"].get("proxyjump", "none") == "none"

    calls.unlink()
    config.write_text(config.read_text() + "Match host nothing-matches\n  Port 1\n")
    again = sshconfig.resolve_with_openssh(names, str(config), "c.yaml", ssh=str(ssh))
    assert again == got
    assert len(calls.read_text().splitlines()) == len(names) + 1


def test_a_config_openssh_refuses_is_bad_input_naming_file_and_line(tmp_path, ssh_client):
    config = tmp_path / "config"
    config.write_text("Host a\n  HostName 10.0.0.1\n  NoSuchOption yes\n")
    cluster = tmp_path / "c.yaml"
    cluster.write_text(yaml.safe_dump({"backend": "ssh", "hosts": ["a"], "ssh_config_file": str(config)}))
    result = launch("jobs/linear.yaml", "--cluster", str(cluster), "--dry-run")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert (f"cluster.ssh_config_file: OpenSSH cannot use it for host 'a': {config}: line 3: "
            f"Bad configuration option: nosuchoption") in result.stderr, result.stderr


@pytest.mark.slow
def test_a_host_defined_in_an_included_file_is_reached(tmp_path, hosts):
    """The issue's example: hosts only an Included file defines were "cannot resolve"."""
    included = tmp_path / "hosts.d"
    included.mkdir()
    (included / "trainers.conf").write_text("".join(
        f"Host trainer-{i}\n  HostName {h}\n" for i, h in enumerate(hosts.hosts)))
    config = tmp_path / "config"
    config.write_text(f"Include {included}/*.conf\n" + open(hosts.ssh_config).read().replace(
        "Host ", "Host trainer-* ", 1))
    assert openssh_connects(hosts, str(config), "trainer-1")
    cluster = write_cluster(tmp_path, hosts, ssh_config_file=str(config))
    raw = yaml.safe_load(open(cluster))
    for i, h in enumerate(raw["hosts"]):
        h["host"] = f"trainer-{i}"
    open(cluster, "w").write(yaml.safe_dump(raw))
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--cluster", cluster, *SHORT, "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: 4 processes succeeded" in result.stdout
    assert not survivors(tmp_path, run_dir, 5)


def test_without_an_ssh_client_a_config_with_include_is_refused_not_misread(tmp_path, monkeypatch):
    from launcher.backends.ssh import sshconfig
    from launcher.errors import SpecError

    config = tmp_path / "config"
    config.write_text("Host a\n  HostName 10.0.0.1\n")
    monkeypatch.setenv("PATH", str(tmp_path))  # no ssh on it: paramiko reads the file
    assert sshconfig.fabric_config(["a"], str(config), "c.yaml").base_ssh_config.lookup("a")["hostname"] \
        == "10.0.0.1"
    config.write_text("Include other.conf\nHost a\n  HostName 10.0.0.1\n")
    with pytest.raises(SpecError, match=r"uses Include, which only the OpenSSH client follows and there "
                                        r"is no `ssh` on PATH here; install it"):
        sshconfig.fabric_config(["a"], str(config), "c.yaml")


def test_the_kernel_tells_a_silent_host_from_a_launcher_behind_on_reading():
    """``kernel_silence`` on a real TCP pair: the host answered (or its data waits unread
    here): 0; we sent and it said nothing since: the seconds of its silence, however busy
    this process's threads were meanwhile (the kernel keeps the times)."""
    import socket
    import time
    import types

    from launcher.backends.ssh.connection import kernel_silence

    with socket.create_server(("127.0.0.1", 0)) as server:
        ours = socket.create_connection(server.getsockname())
        theirs, _ = server.accept()
        with ours, theirs:
            transport = types.SimpleNamespace(sock=ours)
            theirs.sendall(b"hello")                 # the host spoke; we have not read it
            time.sleep(0.3)
            assert kernel_silence(transport) == 0.0  # behind on reading is not silence
            ours.recv(5)
            ours.sendall(b"keepalive?")              # we ask; the host says nothing
            time.sleep(0.6)
            silent = kernel_silence(transport)
            assert silent is not None and silent >= 0.5
            theirs.sendall(b"answer")
            time.sleep(0.05)
            ours.recv(6)
            assert kernel_silence(transport) == 0.0  # answered after our last data
    assert kernel_silence(types.SimpleNamespace(sock=object())) is None  # a ProxyJump channel


def test_the_launchers_connection_is_fabrics_with_the_same_attributes_and_config():
    """hosts.Connection only computes invoke's attribute decisions once (docs/ssh.md): every
    attribute and config key fabric sets comes out as fabric's own class sets it."""
    import fabric

    from launcher.backends.ssh.hosts import Connection
    config = fabric.Config(overrides={"run": {"echo": True}})
    kwargs = dict(user="u", port=2222, config=config, connect_timeout=5,
                  connect_kwargs={"key_filename": ["/k"], "allow_agent": True})
    theirs, ours = fabric.Connection("h.example", **kwargs), Connection("h.example", **kwargs)
    assert vars(ours).keys() == vars(theirs).keys()
    for name in vars(theirs):
        if name not in ("_config", "client"):
            assert getattr(ours, name) == getattr(theirs, name), name
    assert dict(ours.config) == dict(theirs.config) and ours.config.run.echo is True
    ours.forward_agent = True          # a real attribute: on the object, not in its config
    ours.some_key = 1                  # no attribute of that name: a config key, as invoke does
    assert vars(ours)["forward_agent"] is True and ours.config["some_key"] == 1
    assert "some_key" not in vars(ours)
    with pytest.raises(AttributeError):
        ours.no_such_name
    assert ours.keys() == ours.config.keys()  # a dict method proxied to the config


def test_the_first_identity_is_loaded_once_and_paramikos_order_kept(tmp_path):
    """hostkeys.identities: the first identity file, parsed once while unchanged, goes first
    as ``pkey`` (paramiko tries it before the files, then the agent); one that needs a
    passphrase, or any where a passphrase is given, is left to paramiko's own load."""
    from launcher.backends.ssh import hostkeys
    plain, other, locked = (str(tmp_path / n) for n in ("id_a", "id_b", "id_locked"))
    for path, words in ((plain, ""), (other, ""), (locked, "secret words")):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", words, "-f", path], check=True)
    got = hostkeys.identities([plain, other], {})
    assert got["key_filename"] == [other] and got["pkey"].get_name() == "ssh-ed25519"
    assert got["pkey"].get_base64() == open(plain + ".pub").read().split()[1]
    assert hostkeys.identities([plain, other], {})["pkey"] is got["pkey"]  # parsed once
    assert hostkeys.identities([locked, plain], {}) == {"key_filename": [locked, plain]}
    assert hostkeys.identities([plain], {"passphrase": "x"}) == {"key_filename": [plain]}
    assert hostkeys.identities([], {}) == {"key_filename": []}
    with open(plain, "a") as f:  # changed since: read again
        f.write("\n")
    assert hostkeys.identities([plain], {})["pkey"] is not got["pkey"]


def test_a_renewed_certificate_is_loaded_again(tmp_path):
    """A short-lived certificate renewed beside an unchanged key (``id-cert.pub``): the next
    connection offers the new one, as paramiko's own load on every connection would."""
    from launcher.backends.ssh import hostkeys
    ca, key = str(tmp_path / "ca"), str(tmp_path / "id")
    for path in (ca, key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)
    blobs = []
    for identity, valid in (("one", "+1m"), ("renewed", "+1h")):
        subprocess.run(["ssh-keygen", "-q", "-s", ca, "-I", identity, "-n", "root", "-V", valid,
                        key + ".pub"], check=True)
        blobs.append(hostkeys.identities([key], {})["pkey"].public_blob.key_blob)
    assert blobs[0] != blobs[1]
