"""Real hosts over SSH (fabric): preflight every host, fan out, stream, tear down.

One ``fabric.Connection`` per host, opened by the preflight and kept for the
run. Traps of fabric/paramiko this module works around (see docs/ssh.md):

* fabric sets ``AutoAddPolicy`` and loads no known_hosts: every connection
  loads the known_hosts file and uses ``RejectPolicy`` (or ``_AcceptNew``,
  which records unknown keys but, like paramiko itself, refuses changed ones).
* ``ThreadingGroup.run`` joins every host (no fail-fast) and does not quote env
  values: each worker is its own channel, watched on its own, and every value
  goes through ``shlex.quote`` in a script fed to ``sh -s`` on stdin.
* a command started without a pty keeps running when its connection drops,
  and paramiko drops sshd's ``exit-signal``: the remote wrapper
  (``ssh_remote.WRAPPER``) makes the worker a process-group leader, records
  its pgid in a pid file and reports the exit in-band; teardown signals that
  group, over a fresh connection when the old one is gone.
* paramiko's transport keepalive never notices a silent peer: a thread per
  host sends ``keepalive@openssh.com`` with want-reply and declares the host
  lost after ``keepalive_timeout_s`` without an answer.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import socket
import stat
import threading
import time
from typing import Callable, Iterator

import fabric
import paramiko

from launcher import plan as planning
from launcher.backends import ssh_remote
from launcher.errors import LaunchError, Problem, SpecError
from launcher.spec import BUILTIN_TASKS, JobSpec, SshCluster, SshHost
from launcher.supervise import Exit
from worker import contract

DEFAULT_CONNECT_TIMEOUT_S = 10
COMMAND_TIMEOUT_S = 60.0
SYNC_SKIP = {".git", "__pycache__", ".venv", "runs", ".podlaunch", ".pytest_cache"}


# ---- connecting ------------------------------------------------------------
class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """OpenSSH's ``StrictHostKeyChecking accept-new``: record unknown hosts.

    paramiko consults the policy only for hosts it has no key for; a changed
    key raises ``BadHostKeyException`` before any policy runs.
    """

    _lock = threading.Lock()

    def __init__(self, known_hosts_file: str):
        self.known_hosts_file = known_hosts_file

    def missing_host_key(self, client, hostname, key):
        with self._lock:
            os.makedirs(os.path.dirname(self.known_hosts_file) or ".", exist_ok=True)
            with open(self.known_hosts_file, "a", encoding="utf-8") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


@dataclasses.dataclass
class Host:
    """One host of the cluster: its resolved settings, connection and liveness."""

    index: int
    spec: SshHost
    connection: fabric.Connection
    known_hosts_file: str
    host_key_policy: str
    process_ids: tuple
    workdir: str                    # as configured; absolute after preflight
    keepalive_interval_s: float
    keepalive_timeout_s: float
    python: str
    lost: str | None = None
    _pending_since: float | None = None
    _closed: bool = False

    @property
    def name(self) -> str:
        return self.spec.host

    @property
    def address(self) -> str:
        """host:port as connected to (after ssh_config's HostName and Port)."""
        return f"{self.connection.host}:{self.connection.port}"

    def fresh_connection(self) -> fabric.Connection:
        """A new, unopened Connection with the same settings (for teardown)."""
        c = self.connection
        return fabric.Connection(self.spec.host, user=c.user, port=c.port, config=c.config,
                                 connect_timeout=c.connect_timeout,
                                 connect_kwargs=dict(c.connect_kwargs))

    def open(self, connection: fabric.Connection | None = None) -> fabric.Connection:
        """Open ``connection`` (default: the host's own), checking the host key.

        Raises:
          paramiko.BadHostKeyException, paramiko.SSHException (unknown host key,
          refused), paramiko.AuthenticationException, OSError (unreachable).
        """
        c = connection or self.connection
        client = c.client
        if os.path.exists(self.known_hosts_file):
            client.load_host_keys(self.known_hosts_file)
        client.set_missing_host_key_policy(
            _AcceptNew(self.known_hosts_file) if self.host_key_policy == "accept-new"
            else paramiko.RejectPolicy())
        c.open()
        return c

    def start_keepalive(self) -> None:
        threading.Thread(target=self._keepalive, daemon=True, name=f"keepalive-{self.name}").start()

    def _keepalive(self) -> None:
        # global_request(wait=True) blocks until an answer (OpenSSH answers
        # keepalive@openssh.com with REQUEST_FAILURE, which counts) or until the
        # transport dies; check_lost() times the request in flight.
        transport = self.connection.transport
        while not self._closed and self.lost is None:
            self._pending_since = time.monotonic()
            try:
                transport.global_request("keepalive@openssh.com", wait=True)
            except Exception:  # noqa: BLE001  the transport died under us
                pass
            self._pending_since = None
            if not transport.is_active():
                if not self._closed and self.lost is None:
                    self.lost = "connection closed"
                return
            time.sleep(self.keepalive_interval_s)

    def check_lost(self) -> str | None:
        """Why this host can no longer be watched, or None while it answers."""
        pending = self._pending_since
        if self.lost is None and pending is not None and \
                time.monotonic() - pending > self.keepalive_timeout_s:
            self.lost = f"no answer for {self.keepalive_timeout_s:g} s"
            self.close()  # unblocks reader threads waiting on this host's channels
        return self.lost

    def close(self) -> None:
        self._closed = True
        try:
            self.connection.close()
        except Exception:  # noqa: BLE001  closing a dead connection may raise anything
            pass


def _expand(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def _fabric_config(cluster: SshCluster, source: str) -> fabric.Config:
    path = _expand(cluster.ssh_config_file)
    if os.path.exists(path):
        return fabric.Config(runtime_ssh_path=path)
    if cluster.ssh_config_file != "~/.ssh/config":
        raise SpecError([Problem(source, None, "cluster.ssh_config_file",
                                 f"no such file: {path}; fix the path or remove the key")])
    return fabric.Config()  # ~/.ssh/config absent: fabric still reads /etc/ssh/ssh_config


def resolve_hosts(job: JobSpec) -> list[Host]:
    """Per host, its settings by precedence: spec (host, then cluster) > ssh_config > defaults.

    Raises:
      SpecError: ``ssh_config_file`` names a missing file.
    """
    cluster: SshCluster = job.cluster
    config = _fabric_config(cluster, job.source)
    hosts, next_id = [], 0
    for index, spec in enumerate(cluster.hosts):
        ssh_config = config.base_ssh_config.lookup(spec.host)
        timeout = cluster.connect_timeout_s or int(ssh_config.get("connecttimeout",
                                                                  DEFAULT_CONNECT_TIMEOUT_S))
        connect_kwargs = {}
        if cluster.identity_file:
            connect_kwargs["key_filename"] = [_expand(cluster.identity_file)]
        connection = fabric.Connection(spec.host, user=spec.user or cluster.user,
                                       port=spec.port or cluster.port, config=config,
                                       connect_timeout=timeout, connect_kwargs=connect_kwargs)
        known = cluster.known_hosts_file or (ssh_config.get("userknownhostsfile") or
                                             "~/.ssh/known_hosts").split()[0]
        policy = cluster.host_key_policy or (
            "accept-new" if ssh_config.get("stricthostkeychecking") == "accept-new" else "strict")
        count = cluster.processes_on(spec)
        hosts.append(Host(index=index, spec=spec, connection=connection,
                          known_hosts_file=_expand(known), host_key_policy=policy,
                          process_ids=tuple(range(next_id, next_id + count)),
                          workdir=spec.workdir or cluster.workdir,
                          keepalive_interval_s=cluster.keepalive_interval_s,
                          keepalive_timeout_s=cluster.keepalive_timeout_s, python=cluster.python))
        next_id += count
    return hosts


def connect_error(host: Host, exc: BaseException) -> str:
    """One line saying why ``host`` could not be reached, and what to do."""
    c = host.connection
    if isinstance(exc, paramiko.BadHostKeyException):
        return (f"host key CHANGED (got {exc.key.get_name()} {exc.key.get_fingerprint().hex()}, "
                f"{host.known_hosts_file} has another); refused. If the host was reinstalled, "
                f"remove the old key: ssh-keygen -R '[{c.host}]:{c.port}' -f {host.known_hosts_file}")
    if isinstance(exc, paramiko.AuthenticationException):
        return (f"authentication failed for user {c.user!r}; check identity_file, ssh-agent "
                f"and the host's authorized_keys")
    if isinstance(exc, paramiko.SSHException) and "known_hosts" in str(exc):
        return (f"unknown host key (not in {host.known_hosts_file}); add it (ssh-keyscan) or "
                f"set cluster.host_key_policy: accept-new")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return f"unreachable: connection refused at {host.address} (is sshd running?)"
    if isinstance(exc, socket.gaierror):
        return f"unreachable: cannot resolve {c.host!r}"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"unreachable: no answer from {host.address} within {c.connect_timeout} s"
    if isinstance(exc, OSError):
        return f"unreachable: {host.address}: {exc.strerror or exc}"
    return f"ssh failed: {type(exc).__name__}: {exc}"


# ---- running short commands ------------------------------------------------
def run_script(transport: paramiko.Transport, text: str, timeout_s: float = COMMAND_TIMEOUT_S
               ) -> tuple[int, str]:
    """Run a POSIX sh script (fed on stdin) over ``transport``; return (exit status, output).

    Raises:
      TimeoutError: no exit within ``timeout_s`` seconds.
      paramiko.SSHException: the channel could not be opened.
    """
    chan = transport.open_session(timeout=timeout_s)
    try:
        chan.set_combine_stderr(True)
        chan.settimeout(timeout_s)
        chan.exec_command("sh -s")
        chan.sendall(text.encode())
        chan.shutdown_write()
        chunks = []
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                data = chan.recv(65536)
            except socket.timeout:
                raise TimeoutError(f"no answer within {timeout_s:g} s") from None
            if not data:
                break
            chunks.append(data)
        if not chan.status_event.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"no exit status within {timeout_s:g} s")
        return chan.recv_exit_status(), b"".join(chunks).decode(errors="replace")
    finally:
        chan.close()


def signal_group(host: Host, pgid: int, signals: tuple, timeout_s: float = 10.0) -> None:
    """Send ``signals`` (names, e.g. ("TERM", "CONT")) to process group ``pgid`` on ``host``.

    Uses the host's connection when it is alive, else a fresh one. Errors are
    swallowed: teardown must go on for every other host.
    """
    # os.killpg in the remote python: sh's kill builtins disagree on "--" and
    # negative pids (dash rejects both).
    argv = ssh_remote.python_call(host.python, ssh_remote.KILLPG, {"pgid": int(pgid), "signals": list(signals)})
    text = " ".join(shlex.quote(a) for a in argv) + "\n"
    transport = host.connection.transport
    if host.lost is None and transport is not None and transport.is_active():
        try:
            run_script(transport, text, timeout_s)
            return
        except Exception:  # noqa: BLE001  fall through to a fresh connection
            pass
    try:
        with host.open(host.fresh_connection()) as fresh:
            run_script(fresh.transport, text, timeout_s)
    except Exception:  # noqa: BLE001
        pass


# ---- preflight ---------------------------------------------------------------
@dataclasses.dataclass
class Check:
    """What preflight found on one host."""

    host: Host
    reason: str | None = None      # why this host is not fit to run, or None
    facts: dict = dataclasses.field(default_factory=dict)


def _state_dir(workdir: str, job: JobSpec) -> str:
    return os.path.join(workdir, ".podlaunch", job.name)


def _modules(job: JobSpec) -> list:
    modules = ["worker.main"]
    if job.task.name not in BUILTIN_TASKS:
        modules.append(job.task.name.split(":")[0])
    return modules


def _preflight_host(host: Host, job: JobSpec, kill_stale: bool) -> Check:
    cluster: SshCluster = job.cluster
    try:
        host.open()
    except Exception as exc:  # noqa: BLE001  every failure becomes a table row
        return Check(host, connect_error(host, exc))
    want_port = cluster.coordinator_port if host.index == 0 else None
    args = {"modules": _modules(job), "port": want_port, "kill_stale": kill_stale,
            "grace_s": cluster.grace_s, "state_dir": _state_dir(".", job)}
    text = ssh_remote.script(host.workdir, cluster.setup, dict(cluster.env),
                             ssh_remote.python_call(cluster.python, ssh_remote.PREFLIGHT, args))
    try:
        status, output = run_script(host.connection.transport, text)
    except Exception as exc:  # noqa: BLE001
        return Check(host, f"preflight command failed: {exc}")
    for line in output.splitlines():
        if line.startswith(ssh_remote.PREFLIGHT_MARK):
            return Check(host, None, json.loads(line[len(ssh_remote.PREFLIGHT_MARK):]))
    tail = " | ".join(output.strip().splitlines()[-3:]) or "no output"
    if status == 127:
        return Check(host, f"{cluster.python} not found ({tail}); set cluster.python to the "
                     "remote interpreter's absolute path")
    return Check(host, f"workdir/setup/python failed with exit {status}: {tail}")


def _judge(checks: list, job: JobSpec, kill_stale: bool) -> None:
    """Fill in ``reason`` for hosts that answered but are unfit."""
    answered = [c for c in checks if c.reason is None]
    if answered:
        reference = answered[0]
        keys = ("python", "jax", "jaxlib")
        want = {k: reference.facts.get(k) for k in keys}
        for c in answered:
            if c.facts.get("jax") is None or c.facts.get("jaxlib") is None:
                c.reason = "jax/jaxlib not installed for " + job.cluster.python
                continue
            diff = [f"{k} {c.facts.get(k)} (host {reference.host.name}: {want[k]})"
                    for k in keys if c.facts.get(k) != want[k]]
            if diff:
                c.reason = "version mismatch: " + ", ".join(diff)
    for c in answered:
        if c.reason:
            continue
        if c.facts.get("missing_modules"):
            c.reason = (f"not importable: {', '.join(c.facts['missing_modules'])}; install podlaunch "
                        "there, set cluster.env.PYTHONPATH, or use cluster.sync_dir")
        elif c.facts.get("port_error"):
            c.reason = f"coordinator {c.facts['port_error']}; pick another cluster.coordinator_port or 0"
        elif any(r["pids"] for r in c.facts.get("survivors", ())):
            live = [r for r in c.facts["survivors"] if r["pids"]]
            ids = ", ".join(f"p{r['process_id']} (pgid {r['pgid']})" for r in live)
            c.reason = (f"{len(live)} process group(s) of an earlier run of {job.name!r} still alive: "
                        f"{ids} from {live[0]['run_dir']}; "
                        + ("they survived SIGKILL" if kill_stale else "rerun with --kill-stale to stop them"))


def table(checks: list) -> str:
    """Hosts and reasons, one row each, in host order."""
    width = max(len(c.host.name) for c in checks)
    rows = [f"  {'host':<{width}}  processes  reason"]
    for c in checks:
        ids = ",".join(f"p{i}" for i in c.host.process_ids)
        rows.append(f"  {c.host.name:<{width}}  {ids:<9}  {c.reason or 'ok'}")
    return "\n".join(rows)


def refuse_unfit(checks: list, hosts: list, what: str) -> None:
    """Close every connection and raise if any check has a reason.

    Raises:
      LaunchError: "<what> failed on k of n hosts; nothing was started anywhere." and the table.
    """
    bad = [c for c in checks if c.reason]
    if bad:
        for h in hosts:
            h.close()
        raise LaunchError(f"{what} failed on {len(bad)} of {len(hosts)} hosts; nothing was "
                          f"started anywhere.\n{table(checks)}")


def preflight(hosts: list, job: JobSpec, kill_stale: bool = False) -> list:
    """Check every host in parallel (at most ``max_parallel`` at once); connections stay open.

    Returns:
      One Check per host, in host order, with facts (``workdir`` absolute,
      ``port`` on host 0, versions).

    Raises:
      LaunchError: any host is unfit; the message is a table of hosts and
        reasons, and every connection has been closed (nothing was started).
    """
    with concurrent.futures.ThreadPoolExecutor(min(job.cluster.max_parallel, len(hosts))) as pool:
        checks = list(pool.map(lambda h: _preflight_host(h, job, kill_stale), hosts))
    _judge(checks, job, kill_stale)
    refuse_unfit(checks, hosts, "preflight")
    for c in checks:
        c.host.workdir = c.facts["workdir"]
    return checks


# ---- the plan ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SshPlan(planning.Plan):
    """A Plan plus the connected hosts (host order) that will run it."""

    hosts: tuple = ()

    def host_of(self, process_id: int) -> Host:
        return next(h for h in self.hosts if process_id in h.process_ids)

    def remote_run_dir(self, host: Host) -> str:
        return os.path.join(host.workdir, "runs", self.job.name, os.path.basename(self.run_dir))

    def remote_job_path(self, host: Host) -> str:
        return os.path.join(_state_dir(host.workdir, self.job), "job.json")


def coordinator_ip(host: Host) -> str:
    """Host 0's address, resolved once here so every worker gets the same one."""
    try:
        return socket.getaddrinfo(host.connection.host, None, socket.AF_INET,
                                  socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror:
        return host.connection.host  # only the hosts can resolve it (e.g. behind a jump host)


def prepare(job: JobSpec, run_dir: str, python: str, console=None, kill_stale: bool = False
            ) -> SshPlan:
    """Resolve and preflight every host, choose the coordinator port, plan every process.

    Args:
      job: the validated spec (``cluster.backend: ssh``).
      run_dir: the local run directory (logs, and process 0's files at the end).
      python: unused (the remote interpreter is ``cluster.python``).
      console: where progress messages go.
      kill_stale: stop survivors of an earlier run of this job instead of refusing.

    Raises:
      SpecError: bad cluster settings (a missing ssh_config_file).
      LaunchError: preflight failed on some host (a table of hosts and reasons).
    """
    hosts, checks = connect(job, console, kill_stale)
    address = f"{coordinator_ip(hosts[0])}:{checks[0].facts['port']}"
    return plan_processes(job, run_dir, hosts, address)


def connect(job: JobSpec, console=None, kill_stale: bool = False) -> tuple[list, list]:
    """Resolve, connect and preflight every host (``prepare`` without the plan).

    Returns:
      (hosts, checks), both in host order; connections stay open.

    Raises:
      SpecError, LaunchError: as ``prepare``.
    """
    hosts = resolve_hosts(job)
    started = time.monotonic()
    checks = preflight(hosts, job, kill_stale)
    if console is not None:
        killed = len(stopped_survivors(checks))
        console.say(f"preflight ok on {len(hosts)} hosts in {time.monotonic() - started:.1f}s "
                    f"(python {checks[0].facts['python']}, jax {checks[0].facts['jax']})"
                    + (f"; stopped {killed} stale process groups" if killed else ""))
    return hosts, checks


def stopped_survivors(checks: list) -> list:
    """Survivor records preflight stopped, once each (hosts may share a filesystem)."""
    seen = {}
    for c in checks:
        for r in c.facts.get("survivors", ()):
            if r.get("stopped"):
                seen.setdefault((r["pgid"], r["run_dir"]), r)
    return list(seen.values())


def plan_processes(job: JobSpec, run_dir: str, hosts: list, address: str) -> SshPlan:
    """Plan every process of ``hosts`` (preflighted), all given ``address`` as coordinator."""
    cluster: SshCluster = job.cluster
    processes = []
    plan = SshPlan(job=job, run_dir=run_dir, coordinator_address=address, processes=(),
                   hosts=tuple(hosts))
    for host in hosts:
        remote_run_dir = plan.remote_run_dir(host)
        for process_id in host.process_ids:
            env = planning.worker_env(job, remote_run_dir, address, process_id,
                                      plan.remote_job_path(host))
            processes.append(planning.ProcessPlan(
                process_id=process_id, host=host.name, local_device_count=job.local_device_count,
                env=env, argv=(cluster.python, "-m", "worker"),
                log_path=planning.log_path(run_dir, process_id)))
    return dataclasses.replace(plan, processes=tuple(processes))


def describe_start(plan: SshPlan) -> str:
    job = plan.job
    return (f"starting {plan.num_processes} processes x {job.local_device_count} "
            f"{job.cluster.platform} devices on {len(plan.hosts)} hosts over ssh, "
            f"coordinator {plan.coordinator_address}")


# ---- files to and from hosts -------------------------------------------------
def _put_if_changed(sftp: paramiko.SFTPClient, local: str, remote: str, writer: str) -> bool:
    """Copy ``local`` to ``remote`` unless the remote has the same bytes; True if copied.

    ``writer`` makes the temporary name unique: hosts that share a home
    directory (NFS) upload the same file at once, and must not rename each
    other's half-written temporary away.
    """
    with open(local, "rb") as f:
        data = f.read()
    try:
        with sftp.open(remote, "rb") as f:
            if hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest():
                return False
    except OSError:
        pass
    temporary = f"{remote}.{writer}.tmp"
    with sftp.open(temporary, "wb") as f:
        f.write(data)
    sftp.posix_rename(temporary, remote)
    return True


def _mkdirs(sftp: paramiko.SFTPClient, path: str) -> None:
    missing = []
    while path not in ("", "/"):
        try:
            sftp.stat(path)
            break
        except OSError:
            missing.append(path)
            path = os.path.dirname(path)
    for p in reversed(missing):
        sftp.mkdir(p)


def sync_dir(sftp: paramiko.SFTPClient, local_dir: str, remote_dir: str) -> int:
    """Mirror ``local_dir`` into ``remote_dir``: files whose size or mtime differ are copied.

    Skips ``SYNC_SKIP`` names and symlinks; never deletes remote files.

    Returns:
      The number of files copied (0 when nothing changed).
    """
    copied = 0
    _mkdirs(sftp, remote_dir)
    remote = {a.filename: a for a in sftp.listdir_attr(remote_dir)}
    for entry in sorted(os.scandir(local_dir), key=lambda e: e.name):
        if entry.name in SYNC_SKIP or entry.is_symlink():
            continue
        target = f"{remote_dir}/{entry.name}"
        if entry.is_dir():
            copied += sync_dir(sftp, entry.path, target)
            continue
        st = entry.stat()
        have = remote.get(entry.name)
        if have is not None and have.st_size == st.st_size and have.st_mtime == int(st.st_mtime):
            continue
        sftp.put(entry.path, target)
        sftp.utime(target, (int(st.st_atime), int(st.st_mtime)))
        sftp.chmod(target, stat.S_IMODE(st.st_mode))
        copied += 1
    return copied


def _get_tree(sftp: paramiko.SFTPClient, remote: str, local: str) -> int:
    try:
        attrs = sftp.listdir_attr(remote)
    except OSError:
        return 0
    os.makedirs(local, exist_ok=True)
    count = 0
    for a in attrs:
        if stat.S_ISDIR(a.st_mode):
            count += _get_tree(sftp, f"{remote}/{a.filename}", os.path.join(local, a.filename))
        else:
            sftp.get(f"{remote}/{a.filename}", os.path.join(local, a.filename))
            count += 1
    return count


def fetch_results(plan: SshPlan, host: Host) -> int:
    """Bring process 0's ``tensorboard/`` and ``params.npz`` into the local run directory.

    Returns:
      The number of files copied.
    """
    remote = plan.remote_run_dir(host)
    sftp = host.connection.sftp()
    count = _get_tree(sftp, f"{remote}/tensorboard", os.path.join(plan.run_dir, "tensorboard"))
    try:
        sftp.get(f"{remote}/params.npz", os.path.join(plan.run_dir, "params.npz"))
        count += 1
    except OSError:
        pass
    return count


# ---- checkpoints: a copy on the launching machine ------------------------------------
class CheckpointMirror:
    """Keeps process 0's checkpoints in the local run directory too, and puts them back.

    Process 0 writes checkpoints on host 0 (``worker.checkpoint``: complete
    ``step-NNNNNNN`` directories appear by rename). ``sync`` copies every one
    the local ``<run dir>/checkpoints`` lacks (among host 0's newest
    ``checkpoint.keep``) into a hidden temporary directory, then renames it into
    place, and drops local ones beyond the newest ``keep``; the worker
    triggers it with each ``contract.CHECKPOINT_FORMAT`` line and at the end.
    ``push`` (before a resumed or restarted attempt starts) uploads the local
    checkpoints host 0 lacks, the same way: so a run survives losing host 0
    (a preempted VM replaced by a new one, a wiped disk).

    Copies run on their own SFTP channel, one at a time (a lock), in the
    background while training goes on; a failed copy is reported once and
    retried at the next checkpoint.
    """

    def __init__(self, plan: "SshPlan", host: Host, console=None):
        self.host, self.console = host, console
        self.local = os.path.join(plan.run_dir, contract.CHECKPOINTS_DIR)
        self.remote = f"{plan.remote_run_dir(host)}/{contract.CHECKPOINTS_DIR}"
        self.keep = plan.job.checkpoint.keep
        self._lock = threading.Lock()
        self._sftp: paramiko.SFTPClient | None = None
        self._warned = False

    def _local_names(self) -> list:
        names = os.listdir(self.local) if os.path.isdir(self.local) else []
        return [name for _, name in contract.checkpoints_in(names)]

    def _channel(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = paramiko.SFTPClient.from_transport(self.host.connection.transport)
        return self._sftp

    def on_line(self, line: str) -> None:
        """Start a background ``sync`` when ``line`` says a checkpoint was saved."""
        if contract.is_checkpoint_saved(line):
            threading.Thread(target=self.sync, name="checkpoint-mirror", daemon=True).start()

    def sync(self) -> list:
        """Copy host 0's newest checkpoints that are not here yet. Returns the names copied."""
        copied = []
        with self._lock:
            try:
                sftp = self._channel()
                try:
                    names = [name for _, name in contract.checkpoints_in(sftp.listdir(self.remote))]
                except FileNotFoundError:
                    return copied
                for name in names[-self.keep:]:
                    if not os.path.exists(os.path.join(self.local, name)):
                        self._get(sftp, name)
                        copied.append(name)
                for name in self._local_names()[:-self.keep]:
                    shutil.rmtree(os.path.join(self.local, name), ignore_errors=True)
            except Exception as exc:  # noqa: BLE001 - the run goes on; say it once
                self._sftp = None
                if not self._warned and self.console is not None:
                    self._warned = True
                    self.console.say(f"could not copy a checkpoint from {self.host.name} into "
                                     f"{self.local}: {exc} (retried at the next checkpoint)")
        return copied

    def _get(self, sftp: paramiko.SFTPClient, name: str) -> None:
        tmp = os.path.join(self.local, f".tmp-copy-{name}")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for entry in sftp.listdir(f"{self.remote}/{name}"):
            sftp.get(f"{self.remote}/{name}/{entry}", os.path.join(tmp, entry))
        os.rename(tmp, os.path.join(self.local, name))

    def push(self, sftp: paramiko.SFTPClient) -> list:
        """Upload the local checkpoints host 0 lacks. Returns the names uploaded.

        Raises:
          OSError: the upload failed (the attempt must not start without them).
        """
        local = self._local_names()
        if not local:
            return []
        try:
            there = set(sftp.listdir(self.remote))
        except FileNotFoundError:
            _mkdirs(sftp, self.remote)
            there = set()
        pushed = []
        for name in local[-self.keep:]:
            if name in there:
                continue
            tmp = f"{self.remote}/.tmp-push-{name}"
            _mkdirs(sftp, tmp)
            for entry in os.listdir(os.path.join(self.local, name)):
                sftp.put(os.path.join(self.local, name, entry), f"{tmp}/{entry}")
            sftp.posix_rename(tmp, f"{self.remote}/{name}")
            pushed.append(name)
        return pushed


# ---- workers -----------------------------------------------------------------
class SshWorker:
    """One remote worker: its channel, output, pgid and exit."""

    def __init__(self, plan: planning.ProcessPlan, host: Host, script: str, grace_s: float,
                 on_exit: Callable[[], None] | None = None,
                 on_line: Callable[[str], None] | None = None):
        self.plan = plan
        self.host = host
        self.grace_s = grace_s
        self.pgid: int | None = None
        self._on_exit = on_exit
        self._on_line = on_line
        self._reported: str | None = None   # the wrapper's EXIT_MARK payload
        self._eof = threading.Event()
        self._pgid_known = threading.Event()
        self._exit: Exit | None = None
        self._lock = threading.Lock()
        self._chan = host.connection.transport.open_session(timeout=COMMAND_TIMEOUT_S)
        self._chan.set_combine_stderr(True)
        self._chan.exec_command("sh -s")
        self._chan.sendall(script.encode())
        self._chan.shutdown_write()

    def lines(self) -> Iterator[str]:
        try:
            for line in self._received_lines():
                if self._control(line):
                    continue
                if self._on_line is not None:
                    self._on_line(line)
                yield line
        finally:
            self._eof.set()

    def _received_lines(self) -> Iterator[str]:
        """The channel's output split into lines (the last one may lack its newline)."""
        buffer = b""
        while True:
            try:
                data = self._chan.recv(65536)
            except (OSError, EOFError, paramiko.SSHException):
                data = b""
            if not data:
                break
            buffer += data
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                yield raw.decode("utf-8", "replace").rstrip("\r")
        if buffer:
            yield buffer.decode("utf-8", "replace").rstrip("\r")

    def _control(self, line: str) -> bool:
        """Consume the wrapper's marker lines; True when ``line`` was one."""
        if line.startswith(ssh_remote.PGID_MARK):
            self.pgid = int(line[len(ssh_remote.PGID_MARK):])
            self._pgid_known.set()
            return True
        if line.startswith(ssh_remote.EXIT_MARK):
            self._reported = line[len(ssh_remote.EXIT_MARK):]
            return True
        return False

    def poll(self) -> Exit | None:
        if self._exit is not None:
            return self._exit
        lost = self.host.check_lost()
        if lost is not None and self._reported is None:
            return self._finish(Exit(lost=lost), cleanup=True)
        if self._reported is not None:
            fields = dict(item.partition("=")[::2] for item in self._reported.split())
            at = float(fields["at"]) if "at" in fields else None
            if "signal" in fields:
                return self._finish(Exit(signal=int(fields["signal"]), at=at))
            return self._finish(Exit(code=int(fields["code"]), at=at))
        if not self._eof.is_set():
            return None
        # Output ended without the wrapper's report: setup failed, or the
        # connection went away under a running worker.
        if self._chan.status_event.wait(1.0) and self._chan.exit_status != -1:
            if self.pgid is None:
                return self._finish(Exit(code=self._chan.exit_status))
            return self._finish(Exit(lost=f"wrapper ended with status {self._chan.exit_status}"),
                                cleanup=True)
        return self._finish(Exit(lost="connection closed"), cleanup=True)

    def _finish(self, ended: Exit, cleanup: bool = False) -> Exit:
        self._exit = ended
        if cleanup:
            # Nobody else will signal a group whose connection is gone
            # (supervise only tears down running workers): TERM, grace, KILL,
            # over a fresh connection, in a non-daemon thread so the launcher
            # waits for it before exiting.
            threading.Thread(target=self._stop, name=f"cleanup-{self.plan.process_id}").start()
        elif self._on_exit is not None:
            self._on_exit()
        return ended

    def _stop(self) -> None:
        if not self._pgid_known.wait(5.0):
            return
        signal_group(self.host, self.pgid, ("TERM", "CONT"))
        time.sleep(self.grace_s)
        signal_group(self.host, self.pgid, ("KILL",))

    def _send(self, signals: tuple) -> None:
        def send():
            if self._pgid_known.wait(10.0):
                signal_group(self.host, self.pgid, signals)
        threading.Thread(target=send, name=f"signal-{self.plan.process_id}").start()

    def terminate(self) -> None:
        self._send(("TERM", "CONT"))

    def kill(self) -> None:
        self._send(("KILL",))


def _start_host(plan: SshPlan, host: Host, console) -> list:
    cluster: SshCluster = plan.job.cluster
    sftp = host.connection.sftp()
    _mkdirs(sftp, _state_dir(host.workdir, plan.job))
    _put_if_changed(sftp, plan.job_path, plan.remote_job_path(host),
                    writer=f"{socket.gethostname()}-{os.getpid()}-{host.index}")
    if cluster.sync_dir:
        copied = sync_dir(sftp, _expand(cluster.sync_dir), host.workdir)
        if console is not None:
            console.say(f"{host.name}: synced {cluster.sync_dir} ({copied} files changed)")
    workers = []
    for process in plan.processes:
        if process.host != host.name or process.process_id not in host.process_ids:
            continue
        run_dir = plan.remote_run_dir(host)
        pid_file = os.path.join(_state_dir(host.workdir, plan.job), f"process-{process.process_id:03d}.pid")
        argv = ssh_remote.python_call(cluster.python, ssh_remote.WRAPPER, {
            "argv": list(process.argv), "pid_file": pid_file, "run_dir": run_dir,
            "process_id": process.process_id})
        text = ssh_remote.script(host.workdir, cluster.setup, process.env, argv)
        on_exit = on_line = None
        if process.process_id == 0:
            mirror = CheckpointMirror(plan, host, console)
            if process.env.get(contract.RESUME) == "1":  # host 0 may be a new machine
                pushed = mirror.push(sftp)
                if pushed and console is not None:
                    console.say(f"{host.name}: put back {len(pushed)} checkpoints it lacked "
                                f"(newest {pushed[-1]}) from {mirror.local}")
            on_exit, on_line = _fetcher(plan, host, console, mirror), mirror.on_line
        try:
            workers.append(SshWorker(process, host, text, cluster.grace_s, on_exit, on_line))
        except BaseException:
            for started in workers:  # start() never sees these: stop them here
                started.kill()
            raise
    return workers


def _fetcher(plan: SshPlan, host: Host, console, mirror: CheckpointMirror) -> Callable[[], None]:
    def fetch():
        mirror.sync()  # waits for a copy in progress, then takes the last checkpoints
        try:
            count = fetch_results(plan, host)
        except Exception as exc:  # noqa: BLE001  the run's outcome stands; say what is missing
            if console is not None:
                console.say(f"could not copy process 0's files from {host.name}: {exc}")
            return
        if console is not None and count:
            console.say(f"copied {count} files of process 0 from {host.name} into {plan.run_dir}")
    return fetch


def start(plan: SshPlan, console=None) -> list:
    """Put the job on every host and start every worker, hosts in parallel.

    Returns:
      SshWorkers in process_id order.

    Raises:
      LaunchError: some host could not start its workers; those already
        started elsewhere have been killed.
    """
    hosts = list(plan.hosts)
    with concurrent.futures.ThreadPoolExecutor(min(plan.job.cluster.max_parallel, len(hosts))) as pool:
        futures = [pool.submit(_start_host, plan, h, console) for h in hosts]
        concurrent.futures.wait(futures)
    workers, errors = [], []
    for host, future in zip(hosts, futures):
        if future.exception() is not None:
            errors.append(f"{host.name}: {type(future.exception()).__name__}: {future.exception()}")
        else:
            workers += future.result()
    if errors:
        for w in workers:
            w.kill()
        raise LaunchError("could not start on every host; stopped the others:\n  " + "\n  ".join(errors))
    for h in hosts:
        h.start_keepalive()
    return sorted(workers, key=lambda w: w.plan.process_id)
