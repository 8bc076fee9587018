"""The ``cluster:`` settings of the ssh backend (and the SSH part of the tpu backend's).

Plain frozen dataclasses checked by ``launcher.spec.schema``; importing this module
imports no SSH library.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from launcher.spec import schema, syncrules
from worker.contract import valuechecks
from launcher.backends.base import ClusterSettings
from launcher.spec.schema import port_or_zero
from worker.contract.sections import setting
from worker.contract.valuechecks import non_negative, positive


def _non_empty_hosts(hosts: tuple) -> str | None:
    return None if hosts else "expected at least one host (a name, an address, or a mapping with host:)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SshHost:
    """One SSH host; unset fields fall back to the cluster's, then ~/.ssh/config."""

    host: str = setting(check=schema.HOST, doc="host name (or ssh_config alias) or address")
    user: str | None = setting(None, check=schema.USER, doc="login user (default: cluster.user)")
    port: int | None = setting(None, check=valuechecks.in_range(1, 65535), doc="sshd port (default: cluster.port)")
    num_processes: int | None = setting(None, check=valuechecks.in_range(1, 256),
                                        doc="worker processes on this host (default: cluster.processes_per_host)")
    workdir: str | None = setting(None, check=schema.REMOTE_PATH,
                                  doc="remote working directory (default: cluster.workdir)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SshSettings:
    """How to reach and run on hosts over SSH; shared by the ssh and tpu clusters."""

    user: str | None = setting(None, check=schema.USER,
                               doc="login user; unset: ssh_config, then the local user")
    port: int | None = setting(None, check=valuechecks.in_range(1, 65535), doc="sshd port; unset: ssh_config, then 22")
    identity_file: str | None = setting(None, check=valuechecks.LOCAL_PATH,
                                        doc="private key tried first; ssh_config's and ssh-agent's keys follow")
    ssh_config_file: str = setting("~/.ssh/config", check=valuechecks.LOCAL_PATH,
                                   doc="OpenSSH client config read for every host")
    known_hosts_file: str | None = setting(None, check=valuechecks.LOCAL_PATH,
                                           doc="unset: ssh_config UserKnownHostsFile, then ~/.ssh/known_hosts")
    host_key_policy: Literal["strict", "accept-new"] | None = setting(
        None, doc="strict refuses unknown hosts; accept-new records them; a changed key is always refused; "
        "unset: ssh_config StrictHostKeyChecking accept-new, else strict")
    connect_timeout_s: int | None = setting(None, check=positive,
                                            doc="every wait of a connection: TCP connect, the SSH banner, the handshake, the login, the first channel; unset: ssh_config ConnectTimeout, then 10")
    keepalive_interval_s: float = setting(2.0, check=positive, doc="seconds between keepalive requests")
    keepalive_timeout_s: float = setting(15.0, check=positive,
                                         doc="a host that answers no keepalive for this long is lost")
    max_parallel: int = setting(32, check=valuechecks.in_range(1, 1024), doc="hosts contacted at once")
    workdir: str = setting("podlaunch", check=schema.REMOTE_PATH,
                           doc="remote working directory (relative paths: from the login home)")
    python: str = setting("python3", check=schema.COMMAND,
                          doc="remote python that runs the worker (sshd's PATH is minimal: prefer an absolute path)")
    setup: tuple[str, ...] = setting((), doc="shell commands run on each host before the worker (not quoted)")
    sync_dir: str | None = setting(None, check=valuechecks.LOCAL_PATH,
                                   doc="local directory mirrored into each host's workdir before start")
    sync_include: tuple[str, ...] = setting((), doc="globs of sync_dir synced even if skipped by "
                                            "default or looking like a secret")
    sync_exclude: tuple[str, ...] = setting((), doc="globs of sync_dir never synced")
    grace_s: float = setting(5.0, check=non_negative, doc="after SIGTERM, wait this long before SIGKILL")
    env: dict[str, schema.EnvValue] = setting({}, check=schema.env_names, doc="extra environment for every worker")

    @property
    def sync_rules(self) -> syncrules.Rules:
        return syncrules.Rules(tuple(self.sync_include), tuple(self.sync_exclude))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SshCluster(SshSettings, ClusterSettings):
    """Real hosts over SSH (``launcher.backends.ssh``); see docs/ssh.md."""

    backend: Literal["ssh"] = setting("ssh", doc="local, ssh or tpu")
    hosts: tuple[SshHost, ...] = setting(check=_non_empty_hosts,
                                         doc="hosts in process order; host 0 runs the coordinator")
    spares: tuple[SshHost, ...] = setting((), doc="hosts kept in reserve: one replaces a host "
                                          "that fails its preflight after a fault, or is "
                                          "quarantined (restarts.quarantine_after)")
    processes_per_host: int = setting(1, check=valuechecks.in_range(1, 256), doc="worker processes per host")
    devices_per_process: int = setting(1, check=valuechecks.in_range(1, 256),
                                       doc="devices each process sees (cpu: JAX_NUM_CPU_DEVICES)")
    platform: Literal["cpu", "gpu", "tpu"] = setting("cpu", doc="the platform the workers must report")
    coordinator_port: int = setting(0, check=port_or_zero,
                                    doc="JAX coordinator port on host 0; 0 picks a free one there")

    can_shrink: ClassVar[bool] = True

    def processes_on(self, host: SshHost) -> int:
        return host.num_processes or self.processes_per_host

    def problems(self) -> list:
        """Cross-field problems as (key, message) pairs: a host or spare named twice, or a
        spare that is also a host (a host is its name and port)."""
        seen, out = {}, []
        for i, host in enumerate(self.hosts):
            where = seen.setdefault((host.host, host.port), f"cluster.hosts[{i}]")
            if where != f"cluster.hosts[{i}]":  # two places would be one machine run as two
                out.append((("hosts", i), f"{host.host!r} is listed twice ({where} and "
                            f"cluster.hosts[{i}]); list each host once (num_processes: N runs "
                            "more processes on it)"))
        for i, spare in enumerate(self.spares):
            where = seen.get((spare.host, spare.port))
            if where is not None:
                out.append((("spares", i), f"{spare.host!r} is already {where}; a spare must "
                            "be another host"))
            seen.setdefault((spare.host, spare.port), f"cluster.spares[{i}]")
        return out

    @property
    def num_processes_total(self) -> int:
        return sum(self.processes_on(h) for h in self.hosts)
