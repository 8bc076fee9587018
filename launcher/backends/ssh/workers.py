"""Remote workers: start them on every host, stream their lines, signal their process groups.

``ThreadingGroup.run`` joins every host (no fail-fast) and does not quote env
values: each worker is its own channel, watched on its own, and every value
goes through ``shlex.quote`` in a script fed to ``sh -s`` on stdin. The
worker runs under ``launcher.remote.wrapper``, which makes it a process-group
leader, records its pgid in a pid file and reports the exit in-band (paramiko
drops sshd's ``exit-signal``).
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import threading
from typing import Callable, Iterator

import paramiko

from launcher import lines
from launcher import plan as planning
from launcher import remote
from launcher.backends.ssh import connection, transfer
from launcher.backends.ssh.connection import COMMAND_TIMEOUT_S, Host
from launcher.backends.ssh.hosts import expand
from launcher.backends.ssh.mirror import CheckpointMirror
from launcher.backends.ssh.preflight import state_dir
from launcher.backends.ssh.settings import SshSettings
from launcher.errors import LaunchError
from launcher.remote import wrapper
from launcher.state import Exit
from worker import contract


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
        self._chan = host.connection.transport.open_session(timeout=COMMAND_TIMEOUT_S)
        self._chan.set_combine_stderr(True)
        self._chan.exec_command("sh -s")
        self._chan.sendall(script.encode())
        self._chan.shutdown_write()

    def lines(self) -> Iterator[str]:
        try:
            in_long_line = False
            for line in self._received_lines():
                if isinstance(line, lines.Piece):
                    in_long_line = True
                    yield line
                    continue
                line = self._control(line)
                if line is None and in_long_line:
                    line = ""  # the long line ended right before the wrapper's marker
                in_long_line = False
                if line is None:
                    continue
                if self._on_line is not None:
                    self._on_line(line)
                yield line
        finally:
            self._eof.set()

    def _received_lines(self) -> Iterator[str]:
        """The channel's output as lines, and ``lines.Piece``s of lines too long to hold.

        Linear in the bytes received (``lines.LineSplitter``): a 100 MB line
        without a newline once took 95 s, its buffer copied and rescanned for
        every chunk, and starved the keepalive.
        """
        splitter = lines.LineSplitter()
        while True:
            try:
                data = self._chan.recv(65536)
            except (OSError, EOFError, paramiko.SSHException):
                data = b""
            if not data:
                break
            yield from splitter.feed(data)
        yield from splitter.end()

    def _control(self, line: str) -> str | None:
        """Consume the wrapper's markers: ``line`` without one, or None when it was all marker.

        A worker whose last output lacks a newline leaves the exit marker
        glued behind it: the worker's part is kept, the marker taken.
        """
        if line.startswith(wrapper.PGID_MARK):
            self.pgid = int(line[len(wrapper.PGID_MARK):])
            self._pgid_known.set()
            return None
        head, mark, payload = line.rpartition(wrapper.EXIT_MARK)
        if mark and (not head or _is_exit_report(payload)):
            self._reported = payload
            return head or None
        return line

    def poll(self) -> Exit | None:
        if self._exit is not None:
            return self._exit
        lost = self.host.check_lost()
        if lost is not None and self._reported is None:
            return self._finish(Exit(lost=lost), cleanup=True)
        if self._reported is not None:
            code, sig, at = wrapper.parse_exit_report(self._reported)
            return self._finish(Exit(code=code, signal=sig, at=at))
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
        if self._pgid_known.wait(5.0):
            connection.stop_group(self.host, self.pgid, self.grace_s)

    def _send(self, signals: tuple) -> None:
        def send():
            if self._pgid_known.wait(10.0):
                connection.signal_group(self.host, self.pgid, signals)
        threading.Thread(target=send, name=f"signal-{self.plan.process_id}").start()

    def terminate(self) -> None:
        self._send(("TERM", "CONT"))

    def kill(self) -> None:
        self._send(("KILL",))

    def stopped(self) -> bool:
        # Knowing needs a round trip to the host; the watchdog then only loses
        # its hint about which stalled process is the cause.
        return False


def _is_exit_report(payload: str) -> bool:
    try:
        wrapper.parse_exit_report(payload)
    except (ValueError, KeyError, IndexError):
        return False
    return True


def _fetcher(host: Host, placement: planning.Placement, run_dir: str, console,
             mirror: CheckpointMirror) -> Callable[[], None]:
    def fetch():
        mirror.sync()  # waits for a copy in progress, then takes the last checkpoints
        try:
            count = transfer.fetch_results(host.connection.sftp(), placement.run_dir, run_dir)
        except Exception as exc:  # noqa: BLE001  the run's outcome stands; say what is missing
            console.say(f"could not copy process 0's files from {host.name}: {exc}")
            return
        if count:
            console.say(f"copied {count} files of process 0 from {host.name} into {run_dir}")
    return fetch


def start_host(plan: planning.Plan, index: int, host: Host, settings: SshSettings,
               console) -> list:
    """Put the job (and ``sync_dir``) on ``host`` and start its workers (placement ``index``).

    Process 0's worker also mirrors checkpoints and, at its end, fetches the results;
    before a resumed attempt the checkpoints host 0 lacks are put back first.
    """
    placement = plan.placements[index]
    sftp = host.connection.sftp()
    transfer.mkdirs(sftp, os.path.dirname(placement.job_path))
    transfer.put_if_changed(sftp, plan.job_path, placement.job_path,
                            writer=f"{socket.gethostname()}-{os.getpid()}-{index}")
    if settings.sync_dir:
        copied = transfer.sync_dir(sftp, expand(settings.sync_dir), host.workdir)
        console.say(f"{host.name}: synced {settings.sync_dir} ({copied} files changed)")
    if plan.job.is_program:  # the program runs in the workdir, from its synced directory
        copied = transfer.sync_dir(sftp, plan.job.program.dir, host.workdir)
        console.say(f"{host.name}: synced {plan.job.program.dir} ({copied} files changed)")
    workers = []
    for process in plan.on_host(index):
        pid_file = os.path.join(state_dir(host.workdir, plan.job.name),
                                f"process-{process.process_id:03d}.pid")
        argv = remote.python_call(placement.python, "wrapper", {
            "argv": list(process.argv), "pid_file": pid_file, "run_dir": placement.run_dir,
            "process_id": process.process_id})
        text = connection.shell_script(host.workdir, settings.setup, process.env, argv)
        on_exit = on_line = None
        if process.process_id == 0:
            mirror = CheckpointMirror(host, plan.run_dir, placement.run_dir,
                                      plan.job.checkpoint.keep, console)
            if process.env.get(contract.RESUME) == "1":  # host 0 may be a new machine
                pushed = mirror.push(sftp)
                if pushed:
                    console.say(f"{host.name}: put back {len(pushed)} checkpoints it lacked "
                                f"(newest {pushed[-1]}) from {mirror.local}")
            on_exit, on_line = _fetcher(host, placement, plan.run_dir, console, mirror), mirror.on_line
        try:
            workers.append(SshWorker(process, host, text, settings.grace_s, on_exit, on_line))
        except BaseException:
            for started in workers:  # start_all never sees these: stop them here
                started.kill()
            raise
    return workers


def start_all(plan: planning.Plan, hosts: list, settings: SshSettings, console) -> list:
    """Start every worker of ``plan``, hosts in parallel (host i runs placement i).

    Returns:
      SshWorkers in process_id order.

    Raises:
      LaunchError: some host could not start its workers; those already
        started elsewhere have been killed.
    """
    pool = concurrent.futures.ThreadPoolExecutor(min(settings.max_parallel, len(hosts)))
    futures = [pool.submit(start_host, plan, i, h, settings, console) for i, h in enumerate(hosts)]
    try:
        concurrent.futures.wait(futures)
    except BaseException:  # an interrupt: every host still finishes its start, then all stop
        pool.shutdown(wait=True)
        for future in futures:
            if future.exception() is None:
                for w in future.result():
                    w.kill()
        raise
    pool.shutdown(wait=True)
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
