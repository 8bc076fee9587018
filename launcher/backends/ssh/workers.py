"""A remote worker as the launcher watches it: its lines streamed, its end read, its process
group signalled (``SshWorker``); ``launcher.backends.ssh.starting`` starts them on every host.

Each worker is its own channel, watched on its own (``ThreadingGroup.run`` would join every
host, no fail-fast). It runs under ``launcher.remote.wrapper``, which makes it a process-group
leader, records its pgid in a pid file and reports the exit in-band (paramiko drops sshd's
``exit-signal``). Channels come from ``channels.HostChannels`` (more connections where sshd's
``MaxSessions`` asks for them).
"""

from __future__ import annotations

import shlex
import threading
from typing import Callable, Iterator

import paramiko

from launcher.console import lines
from launcher import plan as planning
from launcher import proctl
from launcher.backends.ssh import connection, followlines
from launcher.backends.ssh.channels import GroupStates, HostChannels
from launcher.backends.ssh.connection import COMMAND_TIMEOUT_S
from launcher.remote import wrapper
from launcher.ends import Exit, exit_of, Exited, Lost
from worker.contract import profiling, signals


class SshWorker:
    """One remote worker: its channel, output, pgid and exit."""

    def __init__(self, plan: planning.ProcessPlan, channels: HostChannels, states: GroupStates,
                 script: str, grace_s: float, token: str, on_exit: Callable[[], None] | None = None,
                 on_line: Callable[[str], None] | None = None, written_mark: str | None = None,
                 out_path: str | None = None):
        """Open a channel, send ``script``; with ``written_mark``, return once the script has
        printed that line (its files are written). Raises OSError (the channel closed) if the
        script ends first or says nothing for ``COMMAND_TIMEOUT_S``; paramiko.SSHException.

        ``out_path``: a detached run's (the script runs ``launcher.remote.follow``): the worker
        writes into that file on its host, and the channel carries what the follower sends of
        it; returns once its first line named the wrapper (``pid``, ``since``) and the offset
        its bytes start at (``read_to``: how far the lines taken reach)."""
        self.plan = plan
        self.host = channels.host
        self.channels, self.states = channels, states
        self.grace_s = grace_s
        self.pgid: int | None = None
        self._on_exit = on_exit
        self._on_line = on_line
        self._reported: str | None = None   # the wrapper's EXIT_MARK payload
        self._token = token                 # what the wrapper's control lines carry
        self._eof = threading.Event()
        self._pgid_known = threading.Event()
        self._exit: Exit | None = None
        self._chan = channels.open(COMMAND_TIMEOUT_S)
        self._chan.set_combine_stderr(True)
        self._chan.exec_command("sh -s")
        # no EOF: the channel's stdin stays open for the run, so the wrapper on the host
        # sees it end when this launcher is gone (wrapper ``watch_stdin``)
        self._chan.sendall(script.encode())
        self._pending = b""  # read while waiting for written_mark, not yet split into lines
        # a detached run's: the wrapper's pid and start ticks, its output file, how far read
        self.out_path, self.wrapper_pid, self.since, self.read_to = out_path, None, None, 0
        self._base: int | None = None  # the file's offset of the channel's first byte counted
        self._line_end = 0              # bytes of the channel counted to the last whole line
        try:
            if out_path is not None:  # the follower's first lines (the files are written)
                said, before, after = followlines.first_line(self._chan, token, COMMAND_TIMEOUT_S)
                self._pending, self.wrapper_pid = before + after, int(said["pid"])
                self.since, self.read_to = said.get("since"), int(said["offset"])
                self._base = self.read_to - len(before)
                if said.get("pgid") is not None:  # proven on the host: the wrapper's child
                    self.pgid = int(said["pgid"])
                    states.watch(self.host.index, self.pgid)
                    self._pgid_known.set()
            elif written_mark is not None:
                self._pending = connection.read_past(self._chan, written_mark, COMMAND_TIMEOUT_S)
        except OSError as exc:
            self._chan.close()
            raise OSError(f"the start script of process {plan.process_id} {exc}") from None

    def lines(self) -> Iterator[str]:
        try:
            in_long_line = False
            for line in self._received_lines():
                if isinstance(line, lines.Piece):
                    in_long_line = True
                    yield line
                    continue
                end = self._line_end
                line = self._control(line)
                if line is None and in_long_line:
                    line = ""  # the long line ended right before the wrapper's marker
                in_long_line = False
                if line is not None:
                    if self._on_line is not None:
                        self._on_line(line)
                    yield line
                if self._base is not None:  # taken (in the log): a new follower starts past it
                    self.read_to = max(self.read_to, self._base + end)
        finally:
            self._eof.set()

    def _received_lines(self) -> Iterator[str]:
        """The channel's output as lines, and ``lines.Piece``s of lines too long to hold.

        Linear in the bytes received (``lines.LineSplitter``): a 100 MB line
        without a newline once took 95 s, its buffer copied and rescanned for
        every chunk, and starved the keepalive.
        """
        splitter = lines.LineSplitter()
        data, self._pending = self._pending, b""
        while True:
            if data and self._base is not None:  # a file's bytes: each line's end is counted
                start = 0
                while (end := data.find(b"\n", start)) >= 0:
                    *pieces, line = splitter.feed(data[start:end + 1])
                    yield from pieces
                    self._line_end = splitter.scanned
                    yield line
                    start = end + 1
                yield from splitter.feed(data[start:])
            elif data:
                yield from splitter.feed(data)
            try:
                data = self._chan.recv(65536)
            except (OSError, EOFError, paramiko.SSHException):
                data = b""
            if not data:
                break
        self._line_end = splitter.scanned
        yield from splitter.end()

    def _control(self, line: str) -> str | None:
        """Consume the wrapper's markers: ``line`` without one, or None when it was all marker.

        Only lines with this worker's token are markers (``wrapper.control``): a
        worker printing ``podlaunch-pgid 1`` prints a line like any other. A
        worker whose last output lacks a newline leaves the exit marker glued
        behind it: the worker's part is kept, the marker taken.
        """
        kind, payload, head = wrapper.control(line, self._token)
        if kind is None:
            return line
        if kind == "pgid":
            try:
                self.pgid = int(payload)
            except ValueError:
                return None
            self.states.watch(self.host.index, self.pgid)
            self._pgid_known.set()
            return None
        if kind == "exit":
            self._reported = payload
        return head or None

    def poll(self) -> Exit | None:
        if self._exit is not None:
            return self._exit
        lost = self.host.check_lost()
        if lost is not None and self._reported is None:
            return self._finish(Lost(lost), cleanup=True)
        if self._reported is not None:
            code, sig, at = wrapper.parse_exit_report(self._reported)
            return self._finish(exit_of(code, sig, at))
        if not self._eof.is_set():
            return None
        # Output ended without the wrapper's report: setup failed, or the
        # connection went away under a running worker.
        if self._chan.status_event.wait(1.0) and self._chan.exit_status == 0 \
                and self.wrapper_pid is not None:  # its follower saw the wrapper end
            return self._finish(Lost(f"its wrapper (pid {self.wrapper_pid}) on {self.host.name} "
                                     "ended without an exit report"), cleanup=True)
        if self._chan.status_event.wait(1.0) and self._chan.exit_status != -1:
            if self.pgid is None:
                return self._finish(Exited(self._chan.exit_status))
            return self._finish(Lost(f"wrapper ended with status {self._chan.exit_status}"),
                                cleanup=True)
        return self._finish(Lost("connection closed"), cleanup=True)

    def journal_entry(self) -> dict:
        """What a supervisor that takes a detached run back needs of this process
        (``launcher.rundir.journal``; ``adopt_all``)."""
        return {"process_id": self.plan.process_id, "host": self.host.name,
                "pid": self.wrapper_pid, "since": self.since, "pgid": self.pgid,
                "token": self._token, "out": self.out_path}

    def _finish(self, ended: Exit, cleanup: bool = False) -> Exit:
        self._exit = ended
        if cleanup:
            self._chan.close()  # a reader may wait on it (its connection may not be the host's own)
            # Nobody else will signal a group whose connection is gone
            # (supervise only tears down running workers): TERM, grace, KILL,
            # over a fresh connection, in a non-daemon thread so the launcher
            # waits for it before exiting.
            threading.Thread(target=self._stop, name=f"cleanup-{self.plan.process_id}").start()
        elif self._on_exit is not None:
            self._on_exit()
        return ended

    def _stop(self) -> None:
        if self._pgid_known.wait(5.0):
            connection.stop_group(self.host, self.pgid, self.grace_s)

    def _send(self, names: tuple) -> None:
        def send():
            if self._pgid_known.wait(10.0):
                self.channels.signal(self.pgid, names)
        threading.Thread(target=send, name=f"signal-{self.plan.process_id}").start()

    def terminate(self) -> None:
        self._send(("TERM", "CONT"))

    def kill(self) -> None:
        self._send(("KILL",))

    def dump_stacks(self) -> None:
        # the worker alone (it leads its group: its pid is the pgid), over the host's channels
        def send():
            if self._pgid_known.wait(1.0):
                self.channels.signal(self.pgid, (signals.STACKS_SIGNAL.name[3:],), leader=True)
        threading.Thread(target=send, name=f"stacks-{self.plan.process_id}").start()

    def request_profile(self, text: str, failed: Callable[[str], None] = lambda why: None) -> None:
        # over the host's channels, in the background like a stacks request; every value quoted
        target = f"{self.plan.run_dir}/{profiling.STEPS_FILE}"
        temporary = f"{target}.tmp-{self.plan.process_id}"
        # noclobber: '>' makes the temporary (O_EXCL), never writes through a planted link
        script = (f"umask 077 && rm -f {shlex.quote(temporary)} && set -C && printf '%s\\n' "
                  f"{shlex.quote(text)} > {shlex.quote(temporary)} "
                  f"&& mv -f {shlex.quote(temporary)} {shlex.quote(target)}")

        def send():
            try:
                code, output = self.channels.run(script)
            except Exception as exc:  # noqa: BLE001  said by the caller, on its own thread
                code, output = -1, str(exc)
            if code:
                failed(f"{target} could not be written on {self.host.name}: {output.strip()}")
        threading.Thread(target=send, name=f"profile-{self.plan.process_id}").start()

    def stopped(self) -> bool:
        # the host's /proc says (one round trip per host for every worker, at most
        # once a second: GroupStates)
        return self.pgid is not None and self.states.stopped(self.host.index, self.pgid)

    def stop_unwatched(self, timeout_s: float = 20.0) -> None:
        """SIGKILL the group of a worker no reader watches (a start that failed elsewhere).

        Reads the channel up to the wrapper's pgid line (``lines`` is not running), then
        signals over this host's channels and waits for the answer. A wrapper that
        never started (its channel ends first) left nothing to stop.
        """
        if not self._pgid_known.is_set():
            self._chan.settimeout(timeout_s)
            for line in self._received_lines():
                if self._control(line) and self._pgid_known.is_set():
                    break
        if self.pgid is not None:  # and gone before the launcher says so (or exits)
            self.channels.signal(self.pgid, ("KILL",), timeout_s, wait_s=proctl.KILL_WAIT_S)
        self._chan.close()
