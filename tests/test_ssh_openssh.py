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
import subprocess

import pytest
import yaml

import sshenv
from helpers import REPO, launch
from test_ssh import NUM_HOSTS, SHORT, env, hosts, survivors, write_cluster  # noqa: F401  env, hosts: fixtures

THREE = ("--set", "train.global_batch_size=24", "--set", "data.num_examples=24")


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
    refuse, as CHANGED. Only a key of a type the host lacks: unknown, not changed."""
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
