"""Remote workers: start them on every host, stream their lines, signal their process groups.

``ThreadingGroup.run`` joins every host (no fail-fast) and does not quote env
values: each worker is its own channel, watched on its own, and every value
goes through ``shlex.quote`` in a script fed to ``sh -s`` on stdin. The
worker runs under ``launcher.remote.wrapper``, which makes it a process-group
leader, records its pgid in a pid file and reports the exit in-band (paramiko
drops sshd's ``exit-signal``). Channels come from ``channels.HostChannels``
(more connections where sshd's ``MaxSessions`` asks for them). A start that
fails anywhere stops every worker already started, on every host, before
``start_all`` raises.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import shlex
import socket
import threading
from typing import Callable, Iterator

import paramiko

from launcher.console import lines
from launcher import plan as planning
from launcher import proctl, remote
from launcher.backends.ssh import connection, fetches, followlines, hostscript, transfer
from launcher.backends.ssh.channels import GroupStates, HostChannels
from launcher.backends.ssh.connection import COMMAND_TIMEOUT_S, Host
from launcher.backends.ssh.hosts import expand
from launcher.backends.ssh.preflight import state_dir
from launcher.backends.ssh.settings import SshSettings
from launcher.errors import LaunchError
from launcher.remote import follow, wrapper
from launcher.ends import Exit, exit_of, Exited, Lost
from launcher.words import plural
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


def start_host(plan: planning.Plan, index: int, channels: HostChannels, states: GroupStates,
               settings: SshSettings, console, started: list, job_text: str,
               abort: threading.Event | None = None, syncs: tuple = (),
               detached: bool = False) -> None:
    """Put the job (``job_text``, job.json's) and the directories of ``syncs``
    (``transfer.walked``'s) on a host and start its workers (placement ``index``);
    ``detached``: each writes its output into a file of the run there, which a follower sends
    (``launcher.remote.follow``), so that they outlive the supervisor and lose nothing.

    Each worker is appended to ``started`` as soon as it runs, so a failure
    anywhere can stop it; ``abort`` set (another host failed) starts no more.
    Process 0's worker also mirrors checkpoints and, at its end, fetches the
    results; before a resumed attempt the checkpoints host 0 lacks are put back first.

    Raises:
      Whatever the host's SFTP or channels raise (paramiko.SSHException, OSError).
    """
    host = channels.host
    placement = plan.placements[index]
    writer = f"{socket.gethostname()}-{os.getpid()}-{index}"
    # The job file goes in the first worker's script (hostscript.file_lines). One session is
    # held back for a stop that finds every other taken: host 0's SFTP session (process 0's
    # results, checkpoints put back), a bare one elsewhere (docs/ssh.md, MaxSessions).
    host.connection.sftp() if index == 0 else channels.reserve()
    transfer.sync_all(host, syncs, writer, console.say)
    processes = plan.on_host(index)
    for process in processes:
        if abort is not None and abort.is_set():
            return
        # a pid file per run and process; the wrapper as a file, its args in env: a short ps line
        states_dir, pid_path = pid_file(host, plan, placement, process.process_id)
        argv, script = remote.script_call(placement.python, states_dir, "wrapper")
        args = json.dumps({"argv": list(process.argv), "pid_file": pid_path, "process_id":
                           process.process_id, "run_dir": placement.run_dir,
                           "watch_stdin": not detached, "detached": detached,
                           "env_from_stdin": detached})
        token = secrets.token_hex(16)  # the wrapper's control lines carry it; the worker never sees it
        written = f"podlaunch-job-written {token}" if process is processes[0] else None
        files = ((placement.job_path, job_text, writer),) if written else ()
        files += (script + (f"{writer}-p{process.process_id}",),)  # a temporary per process
        env = {**process.env, wrapper.TOKEN_VAR: token, wrapper.ARGS_VAR: args}
        out = None
        if detached:  # the wrapper writes into a file there; a follower sends it (its docstring)
            out = planning.output_path(placement.run_dir, process.process_id, process.attempt)
            argv, files, env = followlines.script(host, plan, placement, process.process_id, files, {
                wrapper.ARGS_VAR: args, follow.ARGS_VAR: json.dumps(
                    {"start": argv, "out": out, "pid_file": pid_path, "env": process.env})}, token)
        text = hostscript.shell_script(host.workdir, settings.setup, env, argv, files,
                                       None if detached else written)  # detached: its follower says
        on_exit, on_line = fetches.hooks(plan, process, host, placement, console)
        started.append(SshWorker(process, channels, states, text, settings.grace_s, token,
                                 on_exit, on_line, written, out))


def pid_file(host: Host, plan: planning.Plan, placement: planning.Placement,
             process_id: int) -> tuple:
    """``(the job's state directory on the host, the process's pid file there)``."""
    states_dir = state_dir(host.workdir, plan.job.name)
    return states_dir, os.path.join(states_dir, f"{os.path.basename(placement.run_dir)}"
                                                f".process-{process_id:03d}.pid")


def stop_started(workers: list) -> None:
    """SIGKILL every worker in ``workers`` (started, unwatched), all at once; returns when done."""
    threads = [threading.Thread(target=w.stop_unwatched, name=f"stop-{w.plan.process_id}")
               for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def start_all(plan: planning.Plan, channels: dict, settings: SshSettings, console,
              detached: bool = False) -> list:
    """Start every worker of ``plan``, hosts in parallel (host i runs placement i).

    Args:
      channels: host index -> ``HostChannels`` of every host, in placement order.
      detached: a detached run's (``start_host``).

    Returns:
      SshWorkers in process_id order.

    Raises:
      LaunchError: some host could not start its workers. The first failure
        stops the hosts still starting, and every worker already started on
        any host is SIGKILLed (and gone) before this raises.
    """
    states = GroupStates(channels)
    started: list = []
    abort = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(min(settings.max_parallel, len(channels)))
    with open(plan.job_path, encoding="utf-8") as f:
        job_text = f.read()  # job.json as each host's first start script writes it
    syncs = [(expand(d), d, settings.sync_rules) for d in [settings.sync_dir] if d]
    # a program runs in the workdir, from its synced directory (program.dir)
    syncs += [(d, d, rules) for _, d, rules in plan.job.synced_dirs]
    syncs = transfer.walked(syncs, avoid=(plan.run_dir,))
    futures = {pool.submit(start_host, plan, i, c, states, settings, console, started,
                           job_text, abort, syncs, detached): c.host
               for i, c in channels.items()}
    try:
        done, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        if any(f.exception() is not None for f in done):
            abort.set()
        pool.shutdown(wait=True)
    except BaseException:  # an interrupt: hosts finish the worker they are starting, then all stop
        abort.set()
        pool.shutdown(wait=True)
        stop_started(started)
        raise
    errors = [f"{host.name}: {type(f.exception()).__name__}: {f.exception()}"
              for f, host in futures.items() if f.exception() is not None]
    if errors:
        stop_started(started)
        raise LaunchError(f"could not start on every host; stopped the {plural(len(started), 'process')} "
                          "already started:\n  " + "\n  ".join(errors))
    for c in channels.values():
        c.host.start_keepalive()
    return sorted(started, key=lambda w: w.plan.process_id)
