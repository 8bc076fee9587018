"""Session channels on one host past sshd's ``MaxSessions``, and what the host says of its groups.

OpenSSH's sshd allows ``MaxSessions`` session channels per connection (10 by
default; SFTP is one, every worker is one, every short script is one) and
refuses the next with ``SSH2_MSG_CHANNEL_OPEN_FAILURE`` reason 2, which
paramiko raises as ``ChannelException(2, 'Connect failed')`` (sshd's
``session_new: too many sessions`` in its log). The limit is per connection
and the launcher cannot read sshd_config, so ``HostChannels`` learns it by
asking: a channel goes on the newest connection that takes it, and when every
connection refuses, one more connection is opened (one at a time, so a burst
of channels never meets sshd's ``MaxStartups`` with a burst of handshakes).

``GroupStates`` asks each host, through these channels, which of its worker
process groups are stopped (``/proc/PGID/stat`` state ``T`` or ``t``), so the
stall watchdog can name a SIGSTOPped remote worker as the local backend does.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

import paramiko

from launcher import remote
from launcher.backends.ssh.connection import COMMAND_TIMEOUT_S, Host, command_line, run_on_channel
from launcher.remote import killpg

# paramiko.ChannelException.code when sshd refuses a session (SSH2_OPEN_CONNECT_FAILED)
REFUSED = 2


class HostChannels:
    """Session channels on ``host``: its own connection first, more connections as sshd asks.

    Args:
      host: an opened ``Host``; its connection carries the first channels.

    Every connection opened here is closed by ``close`` (the host's own is the host's).
    """

    def __init__(self, host: Host):
        self.host = host
        self.extra: list = []          # fabric Connections opened here, oldest first
        self._reserve = None           # a session held for a stop's last resort (``reserve``)
        self._lock = threading.Lock()
        self._closed = False

    def open(self, timeout_s: float = COMMAND_TIMEOUT_S) -> paramiko.Channel:
        """A new session channel on one of the host's connections.

        Raises:
          paramiko.SSHException, OSError: no connection could be opened or
            took the channel (the host is gone, or refuses connections now).
        """
        with self._lock:
            if self._closed:
                raise paramiko.SSHException(f"{self.host.name}: connections closed")
            # newest first: the older ones were full when it was opened
            for connection in reversed([self.host.connection, *self.extra]):
                transport = connection.transport
                if transport is None or not transport.is_active():
                    continue
                try:
                    return transport.open_session(timeout=timeout_s)
                except paramiko.ChannelException as exc:
                    if exc.code != REFUSED:
                        raise
            fresh = self.host.open(self.host.fresh_connection())
            self.extra.append(fresh)
            return fresh.transport.open_session(timeout=timeout_s)

    @property
    def num_connections(self) -> int:
        """Connections in use: the host's own and those opened here."""
        return 1 + len(self.extra)

    def run(self, text: str, timeout_s: float = COMMAND_TIMEOUT_S) -> tuple[int, str]:
        """Run a POSIX sh script on the host; (exit status, output), as ``connection.run_script``.

        Raises:
          TimeoutError, paramiko.SSHException, OSError.
        """
        return run_on_channel(self.open(timeout_s), text, timeout_s)

    def signal(self, pgid: int, signals: tuple, timeout_s: float = 10.0,
               leader: bool = False, wait_s: float = 0.0) -> None:
        """Send ``signals`` (names) to group ``pgid`` (``leader``: to its leader alone); over
        a fresh connection if these fail. ``wait_s``: then wait up to that many seconds on
        the host for the group to be gone (``launcher.remote.killpg``)."""
        argv = remote.python_call(self.host.python, "killpg", {"pgid": int(pgid),
                                                              "signals": list(signals),
                                                              "leader": leader, "wait_s": wait_s})
        self._run_or_fresh(command_line(argv), timeout_s)

    def _run_or_fresh(self, text: str, timeout_s: float) -> None:
        # teardown must go on for every other worker: errors end here
        if self.host.lost is None:
            try:
                self.run(text, timeout_s)
                return
            except Exception:  # noqa: BLE001  no channel: free one, then a fresh connection
                pass
            if self._free_session():
                deadline = time.monotonic() + 3.0  # sshd frees the session once it has ended
                while True:
                    try:
                        self.run(text, timeout_s)
                        return
                    except Exception:  # noqa: BLE001
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.1)
        try:
            with self.host.open(self.host.fresh_connection()) as fresh:
                run_on_channel(fresh.transport.open_session(timeout=timeout_s), text, timeout_s)
        except Exception:  # noqa: BLE001
            pass

    def reserve(self) -> None:
        """Hold one session on the host's connection, before its workers take theirs: a
        session channel with no command (two packets), which a stop closes as its last
        resort (``_free_session``). Nothing is held where sshd refuses it."""
        try:
            chan = self.open(COMMAND_TIMEOUT_S)
        except Exception:  # noqa: BLE001  no session to spare now: the stop tries the rest
            return
        with self._lock:
            self._reserve, old = chan, self._reserve
        if old is not None:
            old.close()

    def _free_session(self) -> bool:
        """Close the session held in reserve, else the host connection's SFTP session,
        freeing one of its ``MaxSessions``.

        The last resort of a stop that found every connection full and no new one
        taken (the host's sshd stopped listening): a worker left running costs more
        than a checkpoint copy cut short. fabric's ``Connection.sftp()`` opens a new
        client after this (it keeps the client in ``_sftp``, None until opened).
        Returns whether one was open.
        """
        with self._lock:
            chan, self._reserve = self._reserve, None
        if chan is not None:
            chan.close()
            return True
        sftp = getattr(self.host.connection, "_sftp", None)
        if sftp is None:
            return False
        self.host.connection._sftp = None
        try:
            sftp.close()
        except Exception:  # noqa: BLE001
            pass
        return True

    def close(self) -> None:
        """Close the connections opened here (safe to call again)."""
        with self._lock:
            self._closed = True
            extra, self.extra = self.extra, []
            reserve, self._reserve = self._reserve, None
        if reserve is not None:
            reserve.close()
        for connection in extra:
            try:
                connection.close()
            except Exception:  # noqa: BLE001  closing a dead connection may raise anything
                pass


class GroupStates:
    """Which remote worker groups are stopped, asked of every host at once, kept ``max_age_s``.

    Args:
      channels: per host index, its ``HostChannels``.
      max_age_s: an answer this old is asked again (the watchdog asks every poll).
    """

    def __init__(self, channels: dict, max_age_s: float = 1.0):
        self.channels = channels
        self.max_age_s = max_age_s
        self._groups: dict = {}       # host index -> set of pgids to ask about
        self._stopped: set = set()    # (host index, pgid) stopped at the last answer
        self._asked_at: float | None = None
        self._lock = threading.Lock()

    def watch(self, host_index: int, pgid: int) -> None:
        """Ask about group ``pgid`` on host ``host_index`` from now on."""
        with self._lock:
            self._groups.setdefault(host_index, set()).add(int(pgid))
            self._asked_at = None

    def stopped(self, host_index: int, pgid: int) -> bool:
        """Whether the group's leader was stopped at the last answer (asked anew when old).

        A host that does not answer counts as nothing stopped there: the
        watchdog then only loses its hint about the cause.
        """
        with self._lock:
            if self._asked_at is None or time.monotonic() - self._asked_at > self.max_age_s:
                self._stopped = self._ask()
                self._asked_at = time.monotonic()
            return (host_index, int(pgid)) in self._stopped

    def _ask(self) -> set:
        groups = {i: sorted(g) for i, g in self._groups.items() if g}
        if not groups:
            return set()

        def ask(index: int) -> set:
            host = self.channels[index]
            argv = remote.python_call(host.host.python, "killpg",
                                      {"pgids": groups[index], "signals": []})
            try:
                _, output = host.run(command_line(argv), timeout_s=10.0)
            except Exception:  # noqa: BLE001  no answer: nothing known to be stopped
                return set()
            found = remote.parse_marked(output, killpg.MARK) or {}
            return {(index, int(p)) for p in found.get("stopped", ())}

        with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
            return set().union(*pool.map(ask, groups))


def close_all(channels: dict) -> None:
    """Close every ``HostChannels`` in ``channels`` (host index -> HostChannels)."""
    for host_channels in channels.values():
        host_channels.close()

