"""Real OpenSSH servers on loopback addresses, for podlaunch's tests.

``SshTestEnv`` starts one ``/usr/sbin/sshd -D`` process per fake host.  The
hosts are 127.0.0.2, 127.0.0.3, ... (Linux routes all of 127.0.0.0/8 to
``lo``, so no interface setup is needed), all on the same port.  Nothing
listens on or connects to anything but these loopback addresses.  All "hosts"
are the same machine: they share the filesystem and the process table, and
connections arrive from 127.0.0.1; a remote command can tell which host it is
on from ``$SSH_CONNECTION`` (third field).

Everything lives under ``<base_dir>/sshenv``: a client key (``identity_file``),
``known_hosts`` with one ``[127.0.0.x]:PORT ssh-ed25519 ...`` line per host
(brackets because the port is not 22), an ``ssh_config`` for ``ssh -F``, and
per host ``hostN/`` with its host key, sshd_config and ``sshd.log``.

Failure injection: ``stop_host``/``start_host`` (host down / back up),
``regenerate_host_key`` (known_hosts entry becomes wrong),
``set_host_key_kinds`` (RSA and ECDSA host keys besides ed25519),
``reject_client_key`` (host refuses our key) and ``limit_sessions`` (sshd's
``MaxSessions``).  A host can also be another machine's network: ``namespaces``
maps a host index to a network namespace (``tests/harness/netns.py``) whose address
it gets, and its sshd runs in there, with its own loopback.  Needs root (sshd privilege
separation; the remote user is root).  No pytest in here: wrap it in a fixture::

    with SshTestEnv(tmp_path, num_hosts=4) as env:
        rc, out = env.run_on_host(0, "echo hi")
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from harness import ports

SSHD = "/usr/sbin/sshd"
# Each checkout and pytest-xdist worker (gw0, gw1, ...) looks for its sshd port in its own
# range (16000-31999: 50 ports a worker, 10 workers a checkout), so runs starting sshds at once never race for one port on the same
# loopback addresses (tests.harness.ports).
FIRST_PORT = ports.first_port(16000, 500, 50)
# The ports of the sshds this test process started: what a test may count as its own.
STARTED_PORTS: set = set()


def _keygen(path: Path, comment: str, kind: str = "ed25519") -> str:
    """Create a fresh key pair of *kind* (ed25519, ecdsa, rsa) at *path*; return the public key line."""
    pub = Path(f"{path}.pub")
    path.unlink(missing_ok=True)
    pub.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", comment,
                    "-f", str(path)], check=True)
    return pub.read_text().strip()


def _port_free(addr: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as sshd does
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


def proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, comm, state) from /proc."""
    table = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        table[int(d)] = (int(ppid), stat[stat.index("(") + 1:stat.rindex(")")], state)
    return table


def _descendants(pid: int) -> list[int]:
    """Live processes below *pid*: per-connection sshds and their commands."""
    table = proc_table()
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for p, (ppid, _comm, state) in table.items():
            if ppid == parent:
                todo.append(p)
                if state != "Z":
                    found.append(p)
    return found


def _die_with_parent() -> None:
    """preexec_fn: the listener gets SIGTERM if the test process dies."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1 == PR_SET_PDEATHSIG


class SshTestEnv:
    """N loopback hosts, each with its own sshd, host key and log file."""

    user = "root"

    def __init__(self, base_dir, num_hosts: int = 4, namespaces: dict | None = None,
                 addresses: dict | None = None, set_env: dict | None = None):
        if not 1 <= num_hosts <= 250:
            raise ValueError("num_hosts must be in 1..250")
        self.base_dir = Path(base_dir) / "sshenv"
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.namespaces = dict(namespaces or {})  # host index -> (netns name, its address)
        # host index -> another loopback address of this machine (``::1``: an IPv6 host)
        addresses = dict(addresses or {})
        self.hosts = [self.namespaces[i][1] if i in self.namespaces else
                      addresses.get(i, f"127.0.0.{i + 2}") for i in range(num_hosts)]
        self._max_sessions = [50] * num_hosts
        self._ciphers: list[str | None] = [None] * num_hosts  # sshd_config Ciphers; None: sshd's
        self.identity_file = str(self.base_dir / "id_ed25519")
        self.authorized_keys = str(self.base_dir / "authorized_keys")
        self.known_hosts = str(self.base_dir / "known_hosts")
        self.ssh_config = str(self.base_dir / "ssh_config")
        self.port: int | None = None
        self._procs: dict[int, subprocess.Popen] = {}
        self._auth_keys = [self.authorized_keys] * num_hosts  # per host
        self._key_kinds = [("ed25519",)] * num_hosts  # per host: its host keys' kinds
        # The environment every session on the hosts gets (sshd_config SetEnv), as a host's
        # own profile would set it. SHLVL=1: sshd runs each command with root's login shell
        # (bash -c), which Debian's bash makes read ~/.bashrc when sshd started it at shell
        # level 1; this machine's runs `pyenv init` (about 47 processes and 70 ms of CPU per
        # session; 8.7 -> 6.3-7.4 CPU-s for one 4-host test). The hosts stand for other
        # machines, whose startup files are their own: the tests name the hosts' python.
        self.set_env = {"SHLVL": "1", **{k: v for k, v in (set_env or {}).items() if v}}

    def host_key(self, i: int, kind: str = "ed25519") -> Path:
        return self.base_dir / f"host{i}" / f"ssh_host_{kind}_key"

    def log_file(self, i: int) -> Path:
        return self.base_dir / f"host{i}" / "sshd.log"

    def log_tail(self, i: int, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file(i).read_text().splitlines()[-lines:])
        except FileNotFoundError:
            return "<no log file>"

    # -- lifecycle ---------------------------------------------------------
    def start(self, timeout_s: float = 15.0) -> "SshTestEnv":
        """Generate keys and configs, start every sshd, wait until ready."""
        if os.geteuid() != 0:
            raise RuntimeError("SshTestEnv needs root (sshd privilege separation)")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        with ports.claiming():  # until the sshds listen: no other run takes the port meanwhile
            self.port = next((p for p in itertools.chain(range(FIRST_PORT, FIRST_PORT + 50),
                                                         range(16000, 32000))
                              if all(_port_free(h, p) for i, h in enumerate(self.hosts)
                                     if i not in self.namespaces)), None)
            if self.port is None:
                raise RuntimeError("no port free on all loopback test addresses")
            STARTED_PORTS.add(self.port)
            self._start_all(timeout_s)
        return self

    def _start_all(self, timeout_s: float) -> None:
        pub = _keygen(Path(self.identity_file), "podlaunch-test-client")
        Path(self.authorized_keys).write_text(pub + "\n")
        for i in range(len(self.hosts)):
            self.host_key(i).parent.mkdir(exist_ok=True)
            _keygen(self.host_key(i), f"host{i}")
        self.write_known_hosts()
        Path(self.ssh_config).write_text(
            f"Host {' '.join(self.hosts)}\n"
            f"    User {self.user}\n    Port {self.port}\n"
            f"    IdentityFile {self.identity_file}\n    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {self.known_hosts}\n"
            "    GlobalKnownHostsFile /dev/null\n    StrictHostKeyChecking yes\n"
            "    BatchMode yes\n    ConnectTimeout 5\n    LogLevel ERROR\n")
        for i in range(len(self.hosts)):
            self.start_host(i, wait=False)
        self.wait_ready(timeout_s)

    def write_known_hosts(self) -> None:
        """(Re)write known_hosts from the hosts' current keys."""
        lines = []
        for i, host in enumerate(self.hosts):
            kind, blob = Path(f"{self.host_key(i)}.pub").read_text().split()[:2]
            lines.append(f"[{host}]:{self.port} {kind} {blob}\n")
        Path(self.known_hosts).write_text("".join(lines))

    def start_host(self, i: int, wait: bool = True, timeout_s: float = 10.0) -> None:
        """(Re)start host *i*'s sshd with a freshly written sshd_config."""
        self.stop_host(i)
        cfg = self.host_key(i).parent / "sshd_config"
        cfg.write_text(f"""\
Port {self.port}
ListenAddress {self.hosts[i]}
{"".join(f"HostKey {self.host_key(i, kind)}{chr(10)}" for kind in self._key_kinds[i])}PidFile {cfg.parent / 'sshd.pid'}
AuthorizedKeysFile {self._auth_keys[i]}
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
ClientAliveInterval 2
ClientAliveCountMax 3
MaxSessions {self._max_sessions[i]}
{f"Ciphers {self._ciphers[i]}{chr(10)}" if self._ciphers[i] else ""}MaxStartups 100:30:200
{"".join(f'SetEnv "{k}={v}"{chr(10)}' for k, v in self.set_env.items())}PrintMotd no
LogLevel VERBOSE
Subsystem sftp internal-sftp
""")
        with open(self.log_file(i), "ab") as log:  # catches pre-log errors too
            netns = ["ip", "netns", "exec", self.namespaces[i][0]] if i in self.namespaces else []
            self._procs[i] = subprocess.Popen(
                [*netns, SSHD, "-D", "-e", "-f", str(cfg), "-E", str(self.log_file(i))],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, preexec_fn=_die_with_parent)
        if wait:
            self.wait_ready(timeout_s, [i])

    def stop_host(self, i: int, kill_sessions: bool = True) -> None:
        """Stop host *i*'s sshd.

        With kill_sessions (default) the host "goes away": every process
        started through its sshd (connections and the commands they run) gets
        SIGKILL; only processes that detached to init survive.  Without, only
        the listener stops (like ``systemctl stop ssh``); sessions carry on.
        """
        proc = self._procs.pop(i, None)
        if proc is None:
            return
        killed: set[int] = set()
        for _ in range(5 if kill_sessions else 0):  # repeat: sessions may fork
            batch = set(_descendants(proc.pid)) - killed
            if not batch:
                break
            for pid in batch:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            killed |= batch
            time.sleep(0.02)
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            table = proc_table()
            if all(table.get(p, (0, "", "Z"))[2] == "Z" for p in killed):
                break
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop every sshd this env started, with their sessions' processes."""
        for i in list(self._procs):
            self.stop_host(i)

    def __enter__(self) -> "SshTestEnv":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- failure injection -------------------------------------------------
    def regenerate_host_key(self, i: int) -> None:
        """Give host *i* a new host key (known_hosts is NOT updated); restart."""
        _keygen(self.host_key(i), f"host{i}-regenerated")
        self.start_host(i)

    def set_host_key_kinds(self, i: int, kinds: tuple = ("ed25519",)) -> None:
        """Give host *i* host keys of these kinds (new ones generated; ed25519 kept); restart."""
        for kind in kinds:
            if kind != "ed25519" or not self.host_key(i).exists():
                _keygen(self.host_key(i, kind), f"host{i}-{kind}", kind)
        self._key_kinds[i] = tuple(kinds)
        self.start_host(i)

    def reject_client_key(self, i: int) -> None:
        """Make host *i* refuse our user key (empty AuthorizedKeysFile)."""
        empty = self.host_key(i).parent / "authorized_keys.empty"
        empty.write_text("")
        self._auth_keys[i] = str(empty)
        self.start_host(i)

    def limit_sessions(self, i: int, max_sessions: int) -> None:
        """Restart host *i*'s sshd with ``MaxSessions max_sessions`` (channels per connection)."""
        self._max_sessions[i] = max_sessions
        self.start_host(i)

    def set_ciphers(self, i: int, ciphers: str | None) -> None:
        """Restart host *i*'s sshd offering only ``ciphers`` (sshd_config ``Ciphers``, comma
        separated); None: sshd's own list."""
        self._ciphers[i] = ciphers
        self.start_host(i)

    def accept_client_key(self, i: int) -> None:
        """Undo reject_client_key(i)."""
        self._auth_keys[i] = self.authorized_keys
        self.start_host(i)

    def restore(self) -> None:
        """Every host as ``start`` left it: up, our key accepted, only its ed25519 host key,
        MaxSessions 50, sshd's own ciphers, known_hosts listing every host's current key. The session's shared
        hosts (tests/conftest.py ``ssh_hosts``) are restored after each test that used them,
        so no test sees another's injected failure."""
        for i in range(len(self.hosts)):
            proc = self._procs.get(i)
            if (proc is None or proc.poll() is not None or self._key_kinds[i] != ("ed25519",)
                    or self._auth_keys[i] != self.authorized_keys or self._max_sessions[i] != 50
                    or self._ciphers[i] is not None):
                self._key_kinds[i], self._auth_keys[i] = ("ed25519",), self.authorized_keys
                self._max_sessions[i], self._ciphers[i] = 50, None
                self.start_host(i)
        self.write_known_hosts()

    # -- checks and helpers ------------------------------------------------
    def wait_ready(self, timeout_s: float = 15.0, which=None) -> None:
        """Wait until each host (all, or those in *which*) sends an SSH banner."""
        deadline = time.monotonic() + timeout_s
        for i in range(len(self.hosts)) if which is None else which:
            last = "not tried"
            while True:
                proc = self._procs.get(i)
                if proc is None or proc.poll() is not None:
                    why = "is stopped" if proc is None else f"exited rc={proc.returncode}"
                    raise RuntimeError(f"sshd for {self.hosts[i]} {why}; "
                                       f"log tail:\n{self.log_tail(i)}")
                try:
                    with socket.create_connection((self.hosts[i], self.port), 1) as s:
                        s.settimeout(1)
                        banner = s.recv(256)
                    if banner.startswith(b"SSH-"):
                        break
                    last = f"bad banner {banner!r}"
                except OSError as e:
                    last = repr(e)
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sshd for {self.hosts[i]}:{self.port} not ready after "
                        f"{timeout_s}s ({last}); log tail:\n{self.log_tail(i)}")
                time.sleep(0.05)

    def run_on_host(self, i: int, command: str, timeout_s: float = 30.0):
        """Run *command* on host *i* with the real ssh client -> (rc, stdout)."""
        r = subprocess.run(["ssh", "-F", self.ssh_config, "-o", "BatchMode=yes",
                            self.hosts[i], command], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout_s)
        return r.returncode, r.stdout

    def sshd_pids(self) -> list[int]:
        """PIDs of the running listener sshd processes."""
        return [p.pid for p in self._procs.values() if p.poll() is None]


# The start of every skip reason of a test whose real component (sshd, a Slurm cluster)
# cannot run here; .ci/run fails on any skip that carries it.
UNAVAILABLE = "real component unavailable: "


def in_ci() -> bool:
    """Whether this is a CI run (``CI=true``, as CI services and .ci/run set it)."""
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


class Subset:
    """The first ``count`` hosts of a running SshTestEnv: ``hosts`` is cut to them, the rest
    (``ssh_config``, ``stop_host``, ...) is the env's own, so host *i* is the same host in
    both. What a test that needs fewer hosts than the session's shares is this view."""

    def __init__(self, env: SshTestEnv, count: int):
        self._env = env
        self.hosts = env.hosts[:count]

    def __getattr__(self, name):
        return getattr(self._env, name)


@contextlib.contextmanager
def hosts_or_skip(base_dir, num_hosts: int, namespaces: dict | None = None,
                  addresses: dict | None = None, set_env: dict | None = None):
    """An SshTestEnv for a test module; skips the module where sshd cannot run here.

    In CI (``in_ci()``) a missing sshd or root fails every test that needs it instead:
    CI exists to run them (.ci/run installs openssh-server and runs as root).
    """
    import pytest

    if os.geteuid() != 0 or not os.path.exists(SSHD):
        why = "needs root and /usr/sbin/sshd (apt-get install openssh-server)"
        if in_ci():
            pytest.fail(f"CI=true and sshd cannot run here: {why}", pytrace=False)
        pytest.skip(UNAVAILABLE + why)
    with SshTestEnv(base_dir, num_hosts, namespaces, addresses, set_env) as env:
        yield env
