"""Preflight's last check: every host reaches host 0's coordinator address, tried for real.

The workers get one ``coordinator_address``, resolved once on this machine
(``hosts.coordinator_ip``). Whether each host can use it depends on that
host's resolver, routes and firewall, and on what a loopback address means
there (its own machine). So, once the port is known and before anything
starts: host 0 listens on the coordinator port for a moment
(``launcher.remote.reach`` ``listen``, bound as JAX's coordinator binds), and
every host, host 0 included, connects to the exact address its workers will
get and must read back a random token. A host that cannot is bad input (exit
2, nothing started): the message names host 0, the address, the host that
failed and why, and what to do (docs/ssh.md, "The coordinator address").

Where the launch asks for it (``SshHosts.connect(listen=True)``), host 0 is
preflighted first and its ``Listener`` started at once, so every other host's
preflight script tries the address after its preflight, in the same channel:
no channel of its own per host; only host 0's own try runs here.
"""

from __future__ import annotations

import concurrent.futures
import secrets
from typing import Sequence

from launcher import remote
from launcher.backends.ssh.channels import HostChannels
from launcher.backends.ssh.connection import command_line
from launcher.errors import Problem, SpecError
from launcher.remote import reach as remote_reach
from launcher.words import plural
from worker.contract.address import split_host_port
from worker.contract.address import is_loopback

REACH_TIMEOUT_S = 5.0   # each host's connect; a firewall that drops shows as this timeout
LISTEN_TIMEOUT_S = 30.0  # host 0's listener ends by itself after this at the latest


def _read_mark(chan, timeout_s: float) -> dict | None:
    """Read ``chan`` until the listener's marked line; None if it ended without one."""
    chan.settimeout(timeout_s)
    buffer = b""
    while b"\n" not in buffer or remote.parse_marked(buffer.decode(errors="replace"),
                                                     remote_reach.MARK) is None:
        try:
            data = chan.recv(4096)
        except OSError:
            return None
        if not data:
            break
        buffer += data
    return remote.parse_marked(buffer.decode(errors="replace"), remote_reach.MARK)


class Listener:
    """Host 0's side of the check: it listens on the coordinator port for a moment, as JAX's
    coordinator binds, and answers each connection with a random token, however many come
    (another program's, say a failed attempt's JAX client retrying the port, takes no host's
    place), until ``close``.

    ``SshHosts.connect`` starts one as soon as host 0's preflight has found the port, so that
    every other host's preflight script tries ``connect_argv`` in the same channel (one
    channel per host less than a check of its own; docs/ssh.md).

    Args:
      host: host 0 (``python`` runs the listener there).
      address: ``coordinator_address`` as the workers will get it (``ip:port``).
      timeout_s: it ends by itself after this at the latest (the launcher ends it at the
        check: this only bounds a listener whose launcher vanished with the connection
        still open). Started during preflight, it must outlast every host's preflight.
    """

    def __init__(self, host, address: str, timeout_s: float = LISTEN_TIMEOUT_S):
        self.host, self.address, self.timeout_s = host, address, timeout_s
        self.token = secrets.token_hex(16)
        self.error: str | None = None  # why it did not start listening
        self.answers: dict = {}        # host index -> the connect answer its preflight gave
        self._chan = None

    def start(self, open_channel) -> bool:
        """Start listening on a channel from ``open_channel(timeout_s)``; whether it listens."""
        port = split_host_port(self.address)[1]
        argv = remote.python_call(self.host.python, "reach", {
            "role": "listen", "port": port, "token": self.token, "count": None,
            "timeout_s": self.timeout_s})
        try:
            self._chan = open_channel(REACH_TIMEOUT_S * 2)
            self._chan.set_combine_stderr(True)
            self._chan.exec_command("sh -s")
            self._chan.sendall(command_line(argv).encode())  # stdin stays open: its end stops it
            ready = _read_mark(self._chan, REACH_TIMEOUT_S * 4)
        except Exception as exc:  # noqa: BLE001  said as the check that could not run
            ready = {"error": f"the listener could not start ({exc})"}
        if ready is None or "listening" not in ready:
            self.error = (ready or {}).get("error", "the listener did not start")
            self.close()
            return False
        return True

    def connect_argv(self, python: str) -> list:
        """argv of the check from a host: connect to ``address``, read the token back."""
        return remote.python_call(python, "reach", {"role": "connect", "address": self.address,
                                                     "token": self.token,
                                                     "timeout_s": REACH_TIMEOUT_S})

    def close(self) -> None:
        """End the listener; returns once it has (the port is free again for the workers)."""
        chan, self._chan = self._chan, None
        if chan is None:
            return
        try:
            chan.shutdown_write()
            chan.status_event.wait(REACH_TIMEOUT_S)
        except Exception:  # noqa: BLE001  the channel may be gone with its connection
            pass
        finally:
            chan.close()


def check(channels: Sequence[HostChannels], address: str, labels: Sequence[str], where: tuple,
          key: str, console, cpu_collectives: bool = False, listener: Listener | None = None
          ) -> None:
    """Refuse a coordinator address that some host cannot reach, and a gloo address likewise.

    Args:
      channels: per connected host, in placement order, its channels (host 0 serves
        the coordinator).
      address: ``coordinator_address`` as the workers will get it (``ip:port``).
      labels: per host, its processes ("p0", "p2,p3").
      where: (file, line) of the setting that named host 0, for the message.
      key: its dotted key (``cluster.hosts[0]``).
      console: where a check that could not run is said.
      cpu_collectives: the processes will all-reduce over gloo (platform cpu, more than
        one process): each host's name must not resolve to loopback there unless every
        host is on one machine's network (``gloo_problems``).
      listener: host 0's, started during preflight, with the answers the hosts' preflight
        scripts gave (``Listener.answers``); the other hosts are asked here, each on a
        channel of its own. None, or one for another address: a listener is started here.
        Closed at the end either way.

    Raises:
      SpecError: some host cannot reach ``address``, or a host's peers could not
        reach the address gloo gives them (exit 2; nothing was started).
    """
    hosts = [c.host for c in channels]
    host0 = hosts[0]
    if listener is None or listener.address != address:
        if listener is not None:
            listener.close()
        listener = Listener(host0, address)
        listener.start(channels[0].open)
    try:
        if listener.error is not None:
            console.say(f"could not check that every host reaches the coordinator {address}: "
                        f"{host0.name}: {listener.error}")
            return

        def probe(host_channels: HostChannels) -> dict:
            argv = listener.connect_argv(host_channels.host.python)
            try:
                _, output = host_channels.run(command_line(argv), REACH_TIMEOUT_S * 4)
            except Exception as exc:  # noqa: BLE001  said as that host's answer
                return {"ok": False, "error": f"the check could not run there ({exc})"}
            return answer(output)

        asked = [c for c in channels if c.host.index not in listener.answers]
        with concurrent.futures.ThreadPoolExecutor(max(1, len(asked))) as pool:
            found = dict(zip((c.host.index for c in asked), pool.map(probe, asked)))
        answers = [listener.answers.get(h.index) or found[h.index] for h in hosts]
    finally:
        listener.close()
    failed = [(h, ids, a) for h, ids, a in zip(hosts, labels, answers) if not a.get("ok")]
    if not failed:
        problems = gloo_problems(hosts, labels, answers) if cpu_collectives else []
        if problems:
            raise SpecError([Problem(where[0], where[1], key, p) for p in problems])
        return
    ip = split_host_port(address)[0]
    rows = "; ".join(f"{h.name} ({ids}): {a.get('error')}" for h, ids, a in failed)
    message = (f"host 0 {host0.name} serves the coordinator at {address}, which "
               f"{len(failed)} of {plural(len(hosts), 'host')} cannot reach: {rows}. ")
    if is_loopback(ip):
        message += (f"{ip} is a loopback address: on every other machine it is that machine "
                    f"itself. Name host 0 by an address every host can reach (its network "
                    f"address or DNS name; not localhost, nor a name that /etc/hosts maps to "
                    f"127.x, as Debian's 127.0.1.1 line does)")
    else:
        message += ("Name host 0 by an address every host can reach, or open port "
                    f"{address.rpartition(':')[2]} (cluster.coordinator_port) between the hosts")
    raise SpecError([Problem(where[0], where[1], key, message)])


def answer(output: str) -> dict:
    """A host's answer to the check, read from what its script printed."""
    return remote.parse_marked(output, remote_reach.MARK) or {
        "ok": False, "error": "no answer from the check: " + output.strip()[-200:]}


def gloo_problems(hosts: Sequence, labels: Sequence[str], answers: Sequence[dict]) -> list:
    """Per host whose name resolves to loopback there while the hosts are several networks.

    gloo's tcp device (JAX's CPU collectives; jax/_src/xla_bridge.py passes it no
    hostname nor interface) binds the first address ``gethostname()`` resolves to and
    gives it to its peers: a loopback one is that peer's own machine, and the run fails
    at its first all-reduce (``Gloo context initialization failed ... remote=[127.0.0.1]``).
    Hosts in one network namespace of one machine share that loopback: no problem.
    """
    if len({a.get("network") for a in answers}) < 2:
        return []
    out = []
    for host, ids, a in zip(hosts, labels, answers):
        address = a.get("hostname_address")
        if address is not None and is_loopback(address):
            out.append(
                f"{host.name} ({ids}): its name {a['hostname']!r} resolves to {address} there, a "
                f"loopback address; gloo (JAX's CPU collectives) gives its peers that address, "
                f"which on the other machines is their own, and the run would fail at its first "
                f"step. Map {a['hostname']} to the host's network address in its /etc/hosts "
                f"(e.g. replace Debian's '127.0.1.1 {a['hostname']}' line)")
    return out
