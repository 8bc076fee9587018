"""Host settings by precedence, and why a host could not be reached.

Per host: its own setting (``SshHost``), then the cluster's (``SshSettings``),
then the OpenSSH client config as OpenSSH resolves it (``sshconfig``:
``HostName``, ``User``, ``Port``, ``IdentityFile``, ``ConnectTimeout``,
``UserKnownHostsFile``, ``StrictHostKeyChecking``, ``ProxyJump``,
``ProxyCommand``), then the defaults. Works from an ``SshSettings``
and a list of host specs, so the ssh backend (the user's hosts) and the tpu
backend (the hosts gcloud reported) resolve hosts the same way.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import socket
from typing import Sequence

import fabric
import paramiko

from launcher import plan as planning
from launcher.backends.ssh import sshconfig
from launcher.backends.ssh.connection import Host, JumpHostError
from launcher.backends.ssh.hostkeys import KeyCheck, RevokedHostKey, UnknownHostKey, known_hosts_name
from launcher.backends.ssh.settings import SshHost, SshSettings

DEFAULT_CONNECT_TIMEOUT_S = 10
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"  # OpenSSH's default


class Connection(fabric.Connection):
    """fabric's Connection, constructed for a third of the CPU.

    invoke's ``DataProxy`` (which Connection is) decides each attribute set by ``key in
    dir(self)`` (a sorted list of some 200 names, built anew: 13 sets per Connection) and
    builds a message listing every attribute for each attribute it lacks (fabric asks for
    6 it lacks per Connection): 0.63 ms per Connection here, a sixth of the launcher's
    cost per host (docs/ssh.md). The same decisions, from the class's names computed once;
    the same exceptions, with a shorter message.
    """

    _class_names: frozenset = frozenset()

    def __setattr__(self, key, value):
        names = type(self).__dict__.get("_class_names")
        if not names:
            names = frozenset(dir(type(self)))
            type.__setattr__(type(self), "_class_names", names)
        if key in names or key in self.__dict__:  # what dir(self) lists
            object.__setattr__(self, key, value)
        else:
            self[key] = value  # a config key, as invoke sets it

    def __getattr__(self, key):
        try:
            return self._get(key)
        except KeyError:
            if key in self._proxies:
                return getattr(self._config, key)
            raise AttributeError(f"no attribute or config key {key!r}") from None


def expand(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def resolve(settings: SshSettings, specs: Sequence[SshHost], counts: Sequence[int],
            source: str) -> list[Host]:
    """Per host, its settings by precedence: spec (host, then cluster) > ssh_config > defaults.

    Args:
      settings: the cluster's SSH settings.
      specs: the hosts in placement order.
      counts: worker processes per host, same order.
      source: the spec file, for error messages.

    Returns:
      One unopened ``Host`` per spec, in order (nothing is contacted).

    Raises:
      SpecError: ``ssh_config_file`` names a missing file.
    """
    config = sshconfig.fabric_config([spec.host for spec in specs], settings.ssh_config_file, source)
    hosts = []
    for index, (spec, count) in enumerate(zip(specs, counts)):
        ssh_config = config.base_ssh_config.lookup(spec.host)
        timeout = settings.connect_timeout_s or int(ssh_config.get("connecttimeout",
                                                                   DEFAULT_CONNECT_TIMEOUT_S))
        # Never empty: given {}, fabric writes this host's IdentityFiles into the shared
        # config's connect_kwargs, and every later host (and jump host) is offered them too.
        connect_kwargs = {"allow_agent": True}  # paramiko's default, said explicitly
        if settings.identity_file:
            connect_kwargs["key_filename"] = [expand(settings.identity_file)]
        connection = Connection(spec.host, user=spec.user or settings.user,
                                port=spec.port or settings.port, config=config,
                                connect_timeout=timeout, connect_kwargs=connect_kwargs)
        check = host_key_check(settings, ssh_config)
        hosts.append(Host(index=index, name=spec.host, connection=connection,
                          known_hosts_file=check.known_hosts_file, host_key_policy=check.policy,
                          also_known_hosts=check.also_read,
                          hop_check=lambda hop: host_key_check(settings, hop.ssh_config),
                          num_processes=count, workdir=spec.workdir or settings.workdir,
                          keepalive_interval_s=settings.keepalive_interval_s,
                          keepalive_timeout_s=settings.keepalive_timeout_s,
                          python=settings.python))
    return hosts


def host_key_check(settings: SshSettings, ssh_config) -> KeyCheck:
    """How a host (or a jump host) with ``ssh_config`` has its key checked.

    known_hosts: the cluster's ``known_hosts_file``, else ssh_config's
    ``UserKnownHostsFile`` (the first is written to, the others read), else
    ``~/.ssh/known_hosts``; ``GlobalKnownHostsFile`` (default
    /etc/ssh/ssh_known_hosts and /etc/ssh/ssh_known_hosts2) is read too, as
    OpenSSH reads it. Policy: the cluster's ``host_key_policy``, else
    ``accept-new`` when ssh_config's ``StrictHostKeyChecking`` says so, else
    ``strict``.
    """
    user_files = (ssh_config.get("userknownhostsfile") or "~/.ssh/known_hosts").split()
    if settings.known_hosts_file:
        user_files = [settings.known_hosts_file]
    global_files = (ssh_config.get("globalknownhostsfile") or GLOBAL_KNOWN_HOSTS).split()
    policy = settings.host_key_policy or (
        "accept-new" if ssh_config.get("stricthostkeychecking") == "accept-new" else "strict")
    return KeyCheck(expand(user_files[0]), policy,
                    tuple(expand(f) for f in user_files[1:] + global_files if f != "/dev/null"))


def sha256_fingerprint(key) -> str:
    """A key's fingerprint as OpenSSH prints it: ``SHA256:`` + unpadded base64 of its blob's sha256."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def connect_error(host: Host, exc: BaseException) -> str:
    """One line saying why ``host`` could not be reached, and what to do.

    A failed ``ProxyJump`` hop is named first: ``jump host NAME (ADDRESS): WHY``.
    """
    if isinstance(exc, JumpHostError):
        hop = exc.hop
        return (f"jump host {hop.original_host} ({hop.host}:{hop.port}): "
                + _why(exc.cause, hop, exc.known_hosts_file))
    return _why(exc, host.connection, host.known_hosts_file)


# What paramiko says when TCP connected and SSH never started (paramiko #1038): no banner
# before the timeout, an EOF or reset during it, or the session it never made.
NO_SSH_SESSION = ("No existing session", "Error reading SSH protocol banner",
                  "SSH session not active")


def _why(exc: BaseException, c, known_hosts_file: str) -> str:
    address = f"{c.host}:{c.port}"
    if isinstance(exc, paramiko.BadHostKeyException):
        name = known_hosts_name(c.host, c.port)
        return (f"host key CHANGED: the {exc.key.get_name()} key sent by the host has fingerprint "
                f"{sha256_fingerprint(exc.key)}, {known_hosts_file} has another {exc.key.get_name()} "
                f"key for {name}; refused. If the host was reinstalled, remove the old key: "
                f"ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(known_hosts_file)}")
    if isinstance(exc, RevokedHostKey):
        return (f"REVOKED HOST KEY DETECTED: the {exc.key.get_name()} key sent by the host "
                f"(fingerprint {sha256_fingerprint(exc.key)}) is marked as revoked in "
                f"{exc.known_hosts_file}; refused. This could mean that a stolen key is being "
                "used to impersonate this host: ask its administrator")
    if isinstance(exc, paramiko.PasswordRequiredException):  # before its base class
        return (f"the private key for user {c.user!r} is encrypted and no passphrase can be "
                f"asked here ({type(exc).__name__}: {exc}); add it to ssh-agent (ssh-add) so "
                "podlaunch can use it unattended")
    if isinstance(exc, paramiko.ssh_exception.IncompatiblePeer):
        return (f"{address} and paramiko share no key exchange, cipher or host key algorithm "
                f"(paramiko said: {exc}); an old or hardened sshd: compare `ssh -Q kex` and the "
                "host's sshd_config, or upgrade paramiko")
    if isinstance(exc, paramiko.ChannelException):
        return (f"{address} refused to open a session channel (paramiko said: {exc}): sshd's "
                "MaxSessions reached, or sessions disabled for this user; raise MaxSessions "
                "or lower cluster.max_parallel")
    if isinstance(exc, paramiko.AuthenticationException):
        return (f"authentication failed for user {c.user!r}; check identity_file, ssh-agent "
                f"and the host's authorized_keys")
    if isinstance(exc, paramiko.SSHException) and "No authentication methods available" in str(exc):
        agent = "ssh-agent holds no key" if os.environ.get("SSH_AUTH_SOCK") else \
            "no ssh-agent (SSH_AUTH_SOCK is unset)"
        return (f"no key to log in as user {c.user!r} with: {agent}, no identity_file is set "
                "(cluster.identity_file, or IdentityFile in the ssh config) and ~/.ssh has "
                "no default key; load one into the agent (ssh-add) or set "
                "cluster.identity_file")
    if isinstance(exc, UnknownHostKey):
        return (f"unknown host key ({exc}); add it (ssh-keyscan) or "
                f"set cluster.host_key_policy: accept-new")
    if isinstance(exc, (paramiko.SSHException, EOFError)) and any(
            words in str(exc) for words in NO_SSH_SESSION):
        return (f"no SSH session: {address} accepted the TCP connection but no SSH session "
                f"started within {c.connect_timeout} s (no SSH banner, or the connection was "
                "dropped): sshd refusing new connections past its MaxStartups, an overloaded "
                "or hung host, or a port that is not sshd; try `ssh -v` to it and read the "
                f"host's sshd log (paramiko said: {type(exc).__name__}: {exc})")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return f"unreachable: connection refused at {address} (is sshd running?)"
    if isinstance(exc, socket.gaierror):
        return f"unreachable: cannot resolve {c.host!r}"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"unreachable: no answer from {address} within {c.connect_timeout} s"
    if isinstance(exc, OSError):
        return f"unreachable: {address}: {exc.strerror or exc}"
    return f"ssh failed: {type(exc).__name__}: {exc}"


def coordinator_ip(host: Host) -> str:
    """Host 0's address, resolved once here so every worker gets the same one."""
    try:
        return socket.getaddrinfo(host.connection.host, None, socket.AF_INET,
                                  socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror:
        return host.connection.host  # only the hosts can resolve it (e.g. behind a jump host)


def placements(job, settings: SshSettings, hosts: Sequence, run_dir: str,
               extra_env: Sequence[dict] | None = None) -> tuple:
    """One Placement per host, in host order.

    Args:
      job: the validated spec (name, devices per process, platform).
      settings: the cluster's SSH settings (python, env).
      hosts: resolved hosts (``name``, ``workdir``, ``num_processes``).
      run_dir: the local run directory (``plan.remote_run_name`` names the remote one).
      extra_env: per host, environment beyond ``settings.env`` (a TPU slice's).

    The remote run directory is ``<workdir>/runs/<job>/<run>-<hash of the local path>``, and
    the job JSON is in it (each run its own: launches of one job side by side keep theirs,
    even when their local directories share a name).
    """
    out = []
    for i, host in enumerate(hosts):
        remote_run_dir = os.path.join(host.workdir, "runs", job.name, planning.remote_run_name(run_dir))
        out.append(planning.Placement(
            host=host.name, num_processes=host.num_processes,
            local_device_count=job.local_device_count, platform=job.cluster.platform,
            python=settings.python,
            run_dir=remote_run_dir, job_path=os.path.join(remote_run_dir, "job.json"),
            env={**settings.env, **(extra_env[i] if extra_env else {})}, label_host=True))
    return tuple(out)
