"""A worker process on this machine (the local backend's), under the same wrapper as on SSH
hosts (``launcher.remote.wrapper``); ``launcher.backends.local`` places them."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import threading
import time
from typing import Iterator

from launcher import plan as planning
from launcher import proctl, remote
from launcher.console import lines
from launcher.errors import LaunchError
from launcher.plan import Plan, ProcessPlan
from launcher.remote import tail, wrapper
from launcher.ends import Exit, exit_of
from worker.contract import causes, profiling, runfiles, signals

HOST = "127.0.0.1"


class LocalWorker:
    """A worker process on this machine, under ``launcher.remote.wrapper`` as over SSH.

    The wrapper (a child subreaper that dies with the launcher, PR_SET_PDEATHSIG)
    starts the worker as the leader of its own session and, when the worker ends,
    is stopped or the launcher dies, kills every descendant the worker left, even
    those that left its process group. The worker's environment reaches the
    wrapper on stdin, never in a command line, with the wrapper's control token
    (``wrapper.TOKEN_VAR``). Teardown signals the worker's process group directly
    once the wrapper reported it (``PGID_MARK`` with that token) and the group is
    verified to be the wrapper's own child (``_own_group``).
    """

    def __init__(self, plan: ProcessPlan, grace_s: float = 3.0, out_path: str | None = None):
        self.plan = plan
        self.pgid: int | None = None
        self._reported: str | None = None
        self._eof = threading.Event()
        self._token = secrets.token_hex(16)
        # a detached run's (``out_path``): the worker writes into a file of the run, read from
        # there (``read_to``: how far), and its wrapper outlives the supervisor (no
        # PR_SET_PDEATHSIG), so that a supervisor killed loses nothing (``launcher.backends.local.adopt``)
        self.out_path, self.read_to = out_path, 0
        argv = remote.module_call(plan.python or plan.argv[0], "wrapper", {
            "argv": list(plan.argv), "cwd": plan.cwd, "pid_file": None, "run_dir": plan.run_dir or ".",
            "process_id": plan.process_id, "grace_s": grace_s,
            "parent_pid": None if out_path else os.getpid(), "env_from_stdin": True})
        out = subprocess.PIPE
        try:
            if out_path is not None:
                for folder in (os.path.dirname(os.path.dirname(out_path)), os.path.dirname(out_path)):
                    os.makedirs(folder, mode=0o700, exist_ok=True)  # owner-only, as the logs
                out = runfiles.opener(out_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                # an attempt started again (its supervisor killed while starting it): what its
                # strays wrote stays, and is not this worker's
                self.read_to = os.fstat(out).st_size
            # the chip variables this shell exported are not the worker's (``plan.unset``)
            inherited = {k: v for k, v in os.environ.items() if k not in plan.unset}
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, text=True, encoding="utf-8", errors="replace", bufsize=1,
                env=inherited)
        except OSError as exc:
            raise LaunchError(f"cannot start process_id {plan.process_id}: {plan.argv[0]}: "
                              f"{causes.exhausted(exc) or exc.strerror}") from None
        finally:
            if out_path is not None and out != subprocess.PIPE:
                os.close(out)
        self.since = proctl.start_ticks(self._proc.pid)
        try:
            self._proc.stdin.write(json.dumps({**plan.env, wrapper.TOKEN_VAR: self._token}))
            self._proc.stdin.close()
        except OSError:  # it died at once: poll reports how
            pass

    @property
    def pid(self) -> int:
        """The wrapper's pid."""
        return self._proc.pid

    def lines(self) -> Iterator[str]:
        try:
            if self.out_path is not None:
                yield from self._tailed(lambda: self._proc.poll() is None)
                return
            yield from self._taken(lines.stream_lines(self._proc.stdout))
            self._proc.stdout.close()
        finally:
            self._eof.set()

    def _take(self, line: str) -> str:
        """A line read: the wrapper's control lines taken; the worker's text in it returned."""
        kind, payload, head = wrapper.control(line, self._token)
        if kind == "pgid":
            self.pgid = self._own_group(payload)
        elif kind == "exit":
            self._reported = payload
        return head

    def _tailed(self, writer_alive) -> Iterator[str]:
        """The output file's lines from ``read_to`` to the wrapper's exit report (or its end,
        once the wrapper is gone); ``read_to`` moves past a line once the reader has taken it
        (written it to the process's log)."""
        def read():
            for line, end in tail.lines(self.out_path, self.read_to, writer_alive):
                yield lines.Piece(line) if end is None else line
                if end is not None:
                    self.read_to = end
                if self._reported is not None:
                    return

        yield from self._taken(read())

    def _taken(self, items) -> Iterator[str]:
        """The worker's text of ``items`` (whole lines and a long line's ``Piece``s, in constant
        memory): the wrapper's control lines taken; a long line's parts passed on as they come,
        its last part even when empty (the line ends there)."""
        piece = False
        for item in items:
            if isinstance(item, lines.Piece):
                piece = True
                yield item
                continue
            head = self._take(item)
            if head or piece:
                yield head
            piece = False

    def journal_entry(self) -> dict:
        """What a supervisor that takes the run back needs of this process (``launcher.rundir.journal``)."""
        return {"process_id": self.plan.process_id, "pid": self.pid, "since": self.since,
                "pgid": self.pgid, "token": self._token, "out": self.out_path}

    def _own_group(self, payload: str) -> int | None:
        """The reported pgid if it is the wrapper's child and leads its own group, else None
        (then teardown goes through the wrapper: nothing else is ever signalled)."""
        try:
            pgid = int(payload)
        except ValueError:
            return None
        fields = proctl.stat_fields(pgid)
        if fields is None or fields[1] != self.pid or fields[2] != pgid:
            return None
        return pgid

    def poll(self) -> Exit | None:
        code = self._proc.poll()
        if code is None:
            return None
        self._eof.wait(2.0)  # the report is the wrapper's last line
        if self._reported is not None:
            exit_code, sig, at = wrapper.parse_exit_report(self._reported)
            return exit_of(exit_code, sig, at)  # at: when it ended, this clock
        self.kill()  # the wrapper itself died: nothing may outlive it
        return exit_of(code)

    def terminate(self) -> None:
        # CONT: a stopped process must run to act on SIGTERM
        if self.pgid is not None:
            proctl.signal_group(self.pgid, (signal.SIGTERM, signal.SIGCONT))
        else:  # not started yet: the wrapper passes it on
            proctl.signal_pid(self._proc.pid, (signal.SIGTERM,))

    def kill(self) -> None:
        if self.pgid is not None:
            proctl.signal_group(self.pgid, (signal.SIGKILL,))
        proctl.kill_descendants(self.pid)  # also those that left the worker's group

    def abandon(self) -> list:
        """A start that failed: SIGKILL the worker, everything below the wrapper, and the
        wrapper itself, wherever it is in its start (a wrapper not yet past starting its
        worker escapes ``kill``; a worker it starts after this dies with it, by
        PR_SET_PDEATHSIG). Returns the pids killed besides the wrapper, for ``wait_gone``.

        The wrapper is stopped (SIGSTOP) before its descendants are listed, so that it cannot
        start its worker between the listing and its own death: such a worker would die of
        PR_SET_PDEATHSIG, but unlisted, ``wait_gone`` would not wait for it."""
        proctl.signal_pid(self._proc.pid, (signal.SIGSTOP,))
        proctl.wait_until(lambda: proctl.state(self._proc.pid) in (None, "T", "t", "Z"), 1.0)
        below = proctl.descendants(self._proc.pid)
        self.kill()
        proctl.signal_pid(self._proc.pid, (signal.SIGKILL,))
        return below

    def wait_gone(self, pids: list, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the wrapper and ``pids`` to be gone; returns whether
        they are."""
        deadline = time.monotonic() + timeout_s
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return bool(proctl.wait_until(
            lambda: not any(proctl.state(p) not in (None, "Z") for p in pids),
            max(0.0, deadline - time.monotonic())))

    def stopped(self) -> bool:
        return self.pgid is not None and proctl.is_stopped(self.pgid)

    def dump_stacks(self) -> None:
        if self.pgid is not None:  # the worker leads its group: its pid is the pgid
            proctl.signal_pid(self.pgid, (signals.STACKS_SIGNAL,))

    def request_profile(self, text: str, failed=None) -> None:
        profiling.write_request(self.plan.run_dir or ".", text)  # the run directory is here


def start_all(plan: Plan, grace_s: float = 3.0, detached: bool = False) -> list:
    """Start every planned process here; if one cannot start (or an interrupt comes),
    kill those already started. ``detached``: each writes its output into the run directory
    and outlives the supervisor (``LocalWorker``)."""
    workers: list[LocalWorker] = []
    try:
        for process in plan.processes:
            out = (planning.output_path(plan.run_dir, process.process_id, process.attempt)
                   if detached else None)
            workers.append(LocalWorker(process, grace_s, out))
    except BaseException:
        killed = [(w, w.abandon()) for w in workers]
        deadline = time.monotonic() + proctl.KILL_WAIT_S  # gone before the launcher raises
        for w, pids in killed:
            w.wait_gone(pids, max(0.0, deadline - time.monotonic()))
        raise
    return workers
