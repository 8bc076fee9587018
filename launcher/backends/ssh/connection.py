"""One host's SSH connection: opening it with the host key checked, keepalive, short scripts.

Traps of fabric/paramiko worked around here (see docs/ssh.md):

* fabric sets ``AutoAddPolicy`` and loads no known_hosts, on the target and
  on every ``ProxyJump`` hop: each hop, then the target, is checked as
  OpenSSH checks it (``hostkeys``), with its own known_hosts and policy.
* paramiko's transport keepalive never notices a silent peer: a thread per
  host sends ``keepalive@openssh.com`` with want-reply and declares the host
  lost after ``keepalive_timeout_s`` without an answer.
* a command started without a pty keeps running when its connection drops:
  teardown signals the worker's recorded process group with the shipped
  ``launcher.remote.killpg``, over a fresh connection when the old one is gone.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import socket
import struct
import termios
import threading
import time
from typing import Callable

import fabric
import paramiko

from launcher import remote
from launcher.backends.ssh import hostkeys
from launcher.backends.ssh.hostscript import command_line

# paramiko logs a transport's end (a host gone mid-handshake: "Error reading SSH protocol
# banner", with a traceback) at ERROR; with no handler of the user's, Python's last-resort
# handler would print it to stderr. podlaunch reports every such failure itself, per host.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

COMMAND_TIMEOUT_S = 60.0
# paramiko's waits of a connection (SSHClient.connect's keywords) besides the TCP connect's
# own: the server's banner, the login, the first channel; each given connect_timeout_s
SSH_WAITS = ("banner_timeout", "auth_timeout", "channel_timeout")


class JumpHostError(Exception):
    """A ``ProxyJump`` hop could not be opened (the target was never contacted).

    Attributes:
      hop: the hop's fabric Connection.
      known_hosts_file: checked for the hop's key.
      cause: what opening the hop raised.
    """

    def __init__(self, hop: fabric.Connection, known_hosts_file: str, cause: BaseException):
        super().__init__(f"jump host {hop.original_host}: {cause}")
        self.hop, self.known_hosts_file, self.cause = hop, known_hosts_file, cause


@dataclasses.dataclass
class Host:
    """One host of a run: its resolved settings, connection and liveness.

    Attributes:
      index: position in host order (placement order; host 0 runs the coordinator).
      name: the host as the user wrote it (or the address discovered for it).
      connection: fabric's Connection, opened by ``open``.
      num_processes: worker processes it runs.
      workdir: as configured; absolute once preflight has reported it.
      known_hosts_file, host_key_policy: how the host's key is checked.
      also_known_hosts: more known_hosts files read (``hostkeys.KeyCheck.also_read``).
      hop_check: the ``hostkeys.KeyCheck`` for a ``ProxyJump`` hop's
        Connection (default: the host's own).
      synced: what the last preflight read of the syncs' manifest there
        (``syncdir.unchanged``), until the start's sync uses it; None: not read.
    """

    index: int
    name: str
    connection: fabric.Connection
    known_hosts_file: str
    host_key_policy: str
    num_processes: int
    workdir: str
    keepalive_interval_s: float
    keepalive_timeout_s: float
    python: str
    also_known_hosts: tuple = ()
    hop_check: Callable[[fabric.Connection], hostkeys.KeyCheck] | None = None
    lost: str | None = None
    synced: dict | None = None
    _pending_since: float | None = None
    _closed: bool = False

    @property
    def address(self) -> str:
        """host:port as connected to (after ssh_config's HostName and Port)."""
        return f"{self.connection.host}:{self.connection.port}"

    def fresh_connection(self) -> fabric.Connection:
        """A new, unopened Connection with the same settings (for teardown)."""
        c = self.connection
        return type(c)(self.name, user=c.user, port=c.port, config=c.config,
                       connect_timeout=c.connect_timeout, connect_kwargs=dict(c.connect_kwargs))

    def open(self, connection: fabric.Connection | None = None) -> fabric.Connection:
        """Open ``connection`` (default: the host's own), checking the host key.

        Raises:
          JumpHostError: a ``ProxyJump`` hop failed (its cause attached).
          paramiko.BadHostKeyException, hostkeys.UnknownHostKey,
          paramiko.SSHException (refused), paramiko.AuthenticationException,
          OSError (unreachable).
        """
        c = connection or self.connection
        self._open_checked(c, hostkeys.KeyCheck(self.known_hosts_file, self.host_key_policy,
                                                self.also_known_hosts))
        return c

    def _open_checked(self, c: fabric.Connection, check: hostkeys.KeyCheck) -> None:
        # A hop is opened (and its key checked) before anything goes through it;
        # fabric's own c.open() then finds it connected and only opens the tunnel.
        hop = c.gateway
        if isinstance(hop, fabric.Connection) and not hop.is_connected:
            hop_check = self.hop_check(hop) if self.hop_check else check
            try:
                self._open_checked(hop, hop_check)
            except JumpHostError:
                raise
            except Exception as exc:  # noqa: BLE001  said as the hop's failure
                raise JumpHostError(hop, hop_check.known_hosts_file, exc) from exc
        # OpenSSH skips a missing IdentityFile (its defaults are listed whether or
        # not they exist); paramiko would fail the login on one.
        keys = [f for f in c.connect_kwargs.get("key_filename") or []
                if os.path.exists(os.path.expanduser(f))]
        # connect_timeout_s bounds every wait of the connection, as OpenSSH's ConnectTimeout
        # does the handshake: paramiko's own banner (15 s), auth (30 s) and channel waits
        # refused a slow host after 15 s with connect_timeout_s: 40, saying "within 40 s"
        waits = dict.fromkeys(SSH_WAITS, c.connect_timeout) if c.connect_timeout else {}
        c.connect_kwargs = dict(c.connect_kwargs, **waits, **hostkeys.identities(keys, c.connect_kwargs),
                                **hostkeys.prepare(c.client, c.host, c.port, check))
        c.open()

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
        """Why this host can no longer be watched, or None while it answers.

        A keepalive unanswered for ``keepalive_timeout_s`` is not enough: this
        process may be the slow one (its threads busy with a flood of output,
        the answer unread). Where the kernel can tell (``kernel_silence``), the
        host is lost only if it sent nothing since our last data reached the
        socket, for that long, and nothing of it waits unread.
        """
        pending = self._pending_since
        if self.lost is None and pending is not None and \
                time.monotonic() - pending > self.keepalive_timeout_s:
            silent = kernel_silence(self.connection.transport)
            if silent is not None and silent <= self.keepalive_timeout_s:
                return None
            self.lost = f"no answer for {self.keepalive_timeout_s:g} s"
            self.close()  # unblocks reader threads waiting on this host's channels
        return self.lost

    def close(self) -> None:
        self._closed = True
        try:
            self.connection.close()
        except Exception:  # noqa: BLE001  closing a dead connection may raise anything
            pass


def kernel_silence(transport) -> float | None:
    """Seconds the host has left our last data unanswered, as the kernel saw it; None: unknown.

    Read from the connection's TCP socket (Linux ``TCP_INFO``, see tcp(7) and
    ``struct tcp_info`` in linux/tcp.h: ``tcpi_last_data_sent`` and
    ``tcpi_last_data_recv``, milliseconds ago, at byte offsets 44 and 52; and
    ``FIONREAD``, bytes received but unread): 0.0 when data waits unread or
    arrived after the last data we sent, else the milliseconds since the last
    data arrived, in seconds. Independent of this process's threads and their
    CPU time. None where there is no TCP socket (a ``ProxyJump`` channel) or
    the platform has no ``TCP_INFO``.
    """
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket) or not hasattr(socket, "TCP_INFO"):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        sent_ms, _ack_ms, received_ms = struct.unpack_from("=III", info, 44)
        unread = struct.unpack("=i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]
    except (OSError, struct.error):
        return None
    if unread > 0 or received_ms <= sent_ms:
        return 0.0
    return received_ms / 1000.0


def run_script(transport: paramiko.Transport, text: str, timeout_s: float = COMMAND_TIMEOUT_S
               ) -> tuple[int, str]:
    """Run a POSIX sh script (fed on stdin) over ``transport``; return (exit status, output).

    Raises:
      TimeoutError: no exit within ``timeout_s`` seconds.
      paramiko.SSHException: the channel could not be opened.
    """
    return run_on_channel(transport.open_session(timeout=timeout_s), text, timeout_s)


def run_on_channel(chan: paramiko.Channel, text: str, timeout_s: float = COMMAND_TIMEOUT_S
                   ) -> tuple[int, str]:
    """``run_script`` on an opened session channel (closed at the end)."""
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


READ_PAST_MAX_BYTES = 1 << 20  # what a start script may print before its mark


def read_past(chan: paramiko.Channel, mark: str, timeout_s: float, parts: bool = False,
              what: str = "its files were written") -> bytes | tuple:
    """Read ``chan`` until ``"\\n" + mark + "\\n"`` (``shell_script``'s ``written_mark``, which
    holds a random token: it is taken wherever it comes, after a login shell's output without
    a newline too); returns what came before and after it, without it (``parts``: the two).

    Raises:
      OSError: the output ended first, nothing came for ``timeout_s`` seconds, or more than
        ``READ_PAST_MAX_BYTES`` came without it (the message quotes the end of what came: a
        shell's reason).
    """
    want, got, looked = b"\n" + mark.encode() + b"\n", b"", 0
    chan.settimeout(timeout_s)
    while True:
        at = got.find(want, looked)
        if at >= 0:
            chan.settimeout(None)
            before, after = got[:at], got[at + len(want):]
            if parts:
                return before, after
            return before + (b"\n" if before and not before.endswith(b"\n") else b"") + after
        looked = max(0, len(got) - len(want) + 1)  # each byte is looked at about once
        try:
            data = chan.recv(65536) if len(got) <= READ_PAST_MAX_BYTES else b""
        except socket.timeout:
            data = None
        if not data:
            said = got.decode(errors="replace").strip()[-500:] or "no output"
            raise OSError(("said nothing for %g s" % timeout_s if data is None else "ended")
                          + f" before {what}: {said}")
        got += data


def run_on(host: Host, text: str, timeout_s: float) -> None:
    """Run ``text`` on ``host`` over its connection when alive, else over a fresh one.

    Errors are swallowed: teardown must go on for every other host.
    """
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


def signal_group(host: Host, pgid: int, signals: tuple, timeout_s: float = 10.0) -> None:
    """Send ``signals`` (names, e.g. ("TERM", "CONT")) to process group ``pgid`` on ``host``."""
    argv = remote.python_call(host.python, "killpg", {"pgid": int(pgid), "signals": list(signals)})
    run_on(host, command_line(argv), timeout_s)


def stop_group(host: Host, pgid: int, grace_s: float) -> None:
    """The whole stop sequence for group ``pgid``, run on ``host`` (TERM, ``grace_s``, KILL)."""
    argv = remote.python_call(host.python, "killpg", {"pgid": int(pgid), "grace_s": grace_s})
    run_on(host, command_line(argv), grace_s + 15.0)

