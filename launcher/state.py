"""Process state: how each worker stands and how it ended; no printing, no I/O.

A process moves RUNNING -> SUCCEEDED or FAILED (it ended by itself), or
RUNNING -> STOPPED (the launcher stopped it after another failure or an
interrupt); a stalled process is FAILED with the watchdog's verdict as its
exit. ``Tracked``'s methods are the only code that changes a process's state;
``launcher.run.supervise`` decides when to call them, and ``launcher.console.status`` and
``launcher.console`` only read.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import math
import re
import signal
import threading
import time
from typing import Callable, Iterator, Protocol

from launcher.ends import EndedEarly, Exit, Exited, Killed, Stalled
from launcher.plan import ProcessPlan
from launcher.stats import ProcessStats
from worker import contract
from worker.contract import signals, wire

TAIL_LINES = 15
# A frame of a native stack trace (absl's, after "*** Check failure stack trace: ***"): an
# address and a symbol, for the log only. A dozen of them pushed the coordination service's
# words (another process died) out of the tail, and a peer aborted because of a frozen
# process was then named the cause, as often as the trace was printed before the verdict.
NATIVE_FRAME = re.compile(r"^\s+@\s+0x[0-9a-fA-F]+\s")


class Worker(Protocol):
    """What a backend provides for each process it started."""

    plan: ProcessPlan

    def lines(self) -> Iterator[str]:
        """Yield the worker's output lines (stdout and stderr) until it closes."""

    def poll(self) -> Exit | None:
        """The worker's exit, or None while it runs."""

    def terminate(self) -> None:
        """Ask the worker's whole process group to stop (SIGTERM)."""

    def kill(self) -> None:
        """Stop the worker's whole process group now (SIGKILL); works on stopped processes."""

    def stopped(self) -> bool:
        """Whether the process is stopped (SIGSTOP, a tracer) as its host sees it."""

    def dump_stacks(self) -> None:
        """Ask the worker process alone (not its group: a helper would die of the signal)
        for its stacks (``worker.contract.signals.STACKS_SIGNAL``); the answer comes on its output."""

    def request_profile(self, text: str, failed: Callable[[str], None] = ...) -> None:
        """Write ``text`` as ``worker.contract.profiling.STEPS_FILE`` in the worker's run directory, where
        it looks for ``launch profile``'s request (``launcher.run.profiles``). Raises OSError
        when that fails here; a transport that writes in the background calls ``failed(why)``
        instead (from any thread)."""


class State(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # stopped by the launcher after another failure or Ctrl-C


@dataclasses.dataclass
class StacksCapture:
    """One worker's answer to a stacks request (``launcher.run.stacks``), kept out of the
    console and the tail while one is asked; a dump nobody asked for (Python's own on a fatal
    error) is output like any other."""

    lines: list = dataclasses.field(default_factory=list)  # the answer's lines so far
    at: float | None = None  # when the last of them came
    in_dump: bool = False    # the previous line was one of them
    asked: bool = False      # a request is out

    def begin(self) -> None:
        """A stacks request is about to be sent: forget any earlier answer, take the next."""
        self.lines, self.at, self.in_dump = [], None, False
        self.asked = True

    def end(self) -> None:
        """The capture is over: dump lines are output again."""
        self.asked = self.in_dump = False

    def take(self, line: str, now: float) -> bool:
        """Whether ``line``, read at ``now``, is part of the answer asked (then it is kept
        here, not output)."""
        if self.asked and signals.is_stacks_line(line, self.in_dump):
            self.in_dump = True
            self.lines.append(line)
            self.at = now
            return True
        self.in_dump = False
        return False

    def complete(self, now: float, quiet_s: float, output_closed: bool) -> bool:
        """Whether the answer has come and nothing more of it for ``quiet_s`` seconds (or the
        worker's output closed)."""
        return self.at is not None and (now - self.at >= quiet_s or output_closed)


@dataclasses.dataclass
class Tracked:
    """One worker as the launcher sees it: its state, its exit, and what its lines said."""

    worker: Worker
    state: State = State.RUNNING
    exit: Exit | None = None
    ended_at: float | None = None   # when the launcher noticed the exit
    eof_at: float | None = None     # when its output closed: the closest we see to its death
    seen_end_wall: float | None = None  # this machine's clock (time.time) when either came first
    clock_behind_s: float | None = None  # its host's clock behind the others' (blame.mark_clocks_off)
    failed_reported_at: float | None = None  # host time the worker says it caught its error
    last_step: int | None = None
    failed_at_step: bool = False      # last_step came from the worker's own "failed at step" line
    progress_at: float | None = None  # when the last step line or heartbeat arrived
    stall: Exit | None = None         # the watchdog's verdict; its exit once reaped
    finished: bool = False            # it said its training is complete (done, or step N/N)
    joining: str | None = None        # the coordinator address it was joining (JOINING line)
    joining_timeout_s: float | None = None  # the initialization_timeout_s that line named
    joining_at: float | None = None   # when its JOINING line arrived (who was late to join)
    joined: bool = False              # jax.distributed.initialize returned
    joined_at: float | None = None    # when its JOINED line arrived (the ledger's join bucket)
    tail: collections.deque = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None
    stacks: StacksCapture = dataclasses.field(default_factory=StacksCapture)  # launch stacks, a kill
    in_detail: bool = False  # inside an expected failure's traceback (wire.DETAIL_BEGIN)
    stats: ProcessStats = dataclasses.field(default_factory=ProcessStats)  # for status and summary

    @property
    def plan(self) -> ProcessPlan:
        return self.worker.plan

    @property
    def running(self) -> bool:
        return self.state is State.RUNNING

    def observe(self, line: str, now: float) -> bool:
        """Take one output line read at ``now``.

        Returns:
          Whether the line is for the log and the console (heartbeats are for
          the watchdog only).
        """
        if self.stacks.take(line, now):
            return False
        parsed = wire.parse(line)  # once: the step, the join, the end, then the stats
        match parsed:
            case wire.Heartbeat(step=step):
                self._stepped(step, now, failed=False)
                return False
            case wire.FailedAt(at=at):
                self.failed_reported_at = at
                return False
            case wire.Progress(step=step):
                self.finished = self.finished or parsed.finished
                self._stepped(step, now, failed=False)
            case wire.Failed(step=step):
                self._stepped(step, now, failed=True)
            case wire.Done():
                self.finished = True
            case wire.Joining(address=address, timeout_s=timeout_s) if self.joining is None:
                self.joining, self.joining_at, self.joining_timeout_s = address, now, timeout_s
            case wire.Joined() if not self.joined:
                self.joined, self.joined_at = True, now
        if not NATIVE_FRAME.match(line):
            self.tail.append(line)
        self.stats.observe(parsed, now)
        return True

    def _stepped(self, step: int | None, now: float, failed: bool) -> None:
        """A line that names the step it reached (None: one of its head without a step)."""
        if step is not None:
            self.last_step, self.progress_at, self.failed_at_step = step, now, failed

    def detail(self, line: str) -> bool:
        """Whether ``line`` is for the log file only: an expected failure's traceback, between
        ``wire.DETAIL_BEGIN`` and ``DETAIL_END`` (its sentence is on the console)."""
        if line == wire.DETAIL_BEGIN:
            self.in_detail = True
        elif self.in_detail:
            self.in_detail = line != wire.DETAIL_END
            return True
        return self.in_detail

    def output_closed(self, now: float) -> None:
        """Its output ended at ``now``: the closest the launcher sees to its death."""
        self.eof_at = now
        self.seen_end_wall = self.seen_end_wall or time.time()

    def poll(self, clock: Callable[[], float] = time.monotonic) -> bool:
        """Poll a running worker; when it has ended, record how (SUCCEEDED or FAILED).

        Returns:
          True when it has ended (now or before).
        """
        if self.state is not State.RUNNING:
            return True
        ended = self.worker.poll()
        if ended is None:
            return False
        if ended.ok and not self._saw_finish() and self._expected_finish():
            ended = EndedEarly(self._early_text(), at=ended.at)
        self.exit, self.ended_at = ended, clock()
        self.seen_end_wall = self.seen_end_wall or time.time()
        self.state = State.SUCCEEDED if ended.ok else State.FAILED
        return True

    def _saw_finish(self, wait_s: float = 2.0) -> bool:
        """Whether its output said training completed; waits (real time) up to ``wait_s``
        for the reader to take lines still in the pipe (a local exit can be seen first)."""
        deadline = time.monotonic() + wait_s
        while not self.finished and self.reader is not None and self.reader.is_alive() \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.finished

    def _expected_finish(self) -> bool:
        """Whether an exit 0 needed a finish line: always for the built-in worker; for a
        program job (``ProcessPlan.program``) when it said how many steps it reports
        (``program_num_steps``), or once it reported a step (its progress lines name the
        last step); a program that says nothing of steps ends as it sees fit."""
        return (not self.plan.program or self.plan.program_num_steps is not None
                or self.stats.progress is not None)

    def _early_text(self) -> str:
        progress = self.stats.progress
        if self.last_step is None:
            return "before its first logged step (it never said done)"
        total = f" of {progress.num_steps}" if progress is not None else ""
        return f"before its last step (last logged step {self.last_step}{total}; it never said done)"

    @property
    def failed_to_join(self) -> bool:
        """It ended while joining the coordinator: JAX's abort on an initialization timeout
        (SIGABRT; jax 0.9 exits with code 1 after its fatal "RegisterTask" log instead), or the
        worker's own ``EXIT_INIT`` (not a SIGKILL or SIGTERM from outside)."""
        ended = self.exit
        return (self.joining is not None and not self.joined and ended is not None
                and (isinstance(ended, Killed) and ended.signal == signal.SIGABRT
                     or isinstance(ended, Exited) and ended.code in (1, contract.EXIT_INIT)))

    def mark_stalled(self, what: str) -> None:
        """The watchdog's verdict on a running worker: alive, but no step progress (``what``)."""
        self.stall = Stalled(what)

    def stopped_by_launcher(self) -> None:
        """Teardown is over: a worker it had to stop (running when it began) did not succeed
        by itself, so it counts as STOPPED, whatever its exit; a stalled one is FAILED,
        with the stall as its exit (the SIGKILL that ended it was the launcher's)."""
        if self.stall is not None:
            self.exit, self.state = self.stall, State.FAILED
        elif self.state is not State.SUCCEEDED:
            self.state = State.STOPPED


@dataclasses.dataclass
class Result:
    """The outcome of a run: per process, in process_id order."""

    processes: list
    first_failure: Tracked | None
    interrupted: bool
    elapsed_s: float
    stacks: list = dataclasses.field(default_factory=list)  # read before the teardown: summary lines

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 1 if self.first_failure is not None or any(
            t.state is not State.SUCCEEDED for t in self.processes) else 0

    @property
    def diverged_loss(self) -> float | None:
        """The loss of the furthest logged step when it is nan or inf, else None: a run
        that ran every step to such a loss diverged; it did not succeed (the launch
        exits 1, run.json says ``diverged``)."""
        reported = [t.stats.progress for t in self.processes if t.stats.progress is not None]
        if not reported:
            return None
        loss = max(reported, key=lambda p: p.step).loss
        return None if loss is None or math.isfinite(loss) else loss


@dataclasses.dataclass(frozen=True)
class Watchdog:
    """When a live worker without step progress counts as failed (None = never).

    Attributes:
      stall_timeout_s: seconds since its last step line or heartbeat.
      first_step_timeout_s: seconds from the start to its first one (imports,
        joining, data loading and compilation come first).
    """

    stall_timeout_s: float | None = None
    first_step_timeout_s: float | None = None


# What ledger.json and run.json keep of each ``Session.host_changes`` entry (a host the run
# stopped using: replaced by a spare, dropped by a shrink, excluded by Slurm)
HOST_CHANGE_FIELDS = ("host", "process_ids", "by", "why", "num_processes")
