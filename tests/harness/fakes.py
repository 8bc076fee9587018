"""Process-free stand-ins for supervision tests: a fake clock, fake workers, a fake session.

``launcher.run.supervise`` reads the injected ``clock`` and lets time pass only
through the injected ``sleep``; ``FakeClock.sleep`` advances the clock, then
waits until supervise's reader threads have read every line that is due, so
what a test sees does not depend on thread scheduling. A ``FakeWorker``
follows a script in fake time: lines at given times, an exit at a given time
(or after N polls), how it answers SIGTERM, whether it is stopped; it records
every terminate/kill/stopped call with the fake time it came at.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import types

from launcher import plan as planning
from launcher.backends.base import Reattach, Session
from launcher.plan import Placement, ProcessPlan
from launcher.spec import kinds
from launcher.ends import Exit, Killed
from worker.contract import profiling

SETTLE_TIMEOUT_S = 5.0  # real seconds: a reader that takes longer is a bug in the test or the product
# Fake seconds no test needs (the longest waits for timeouts of minutes): a supervision
# loop that never ends fails here in milliseconds, not at pytest's timeout minutes later.
FAKE_TIME_LIMIT_S = 86_400.0


class FakeClock:
    """Monotonic seconds that move only when someone sleeps.

    Args:
      interrupts: fake times; the first sleep that reaches each raises
        ``KeyboardInterrupt`` (or calls ``on_interrupt`` when given), once.
      limit_s: fake seconds after which a sleep fails the test (a loop that never ends).
    """

    def __init__(self, start: float = 0.0, interrupts=(), on_interrupt=None,
                 limit_s: float = FAKE_TIME_LIMIT_S):
        self.now, self.limit = start, start + limit_s
        self.cond = threading.Condition()
        self.workers: list = []
        self.interrupts = sorted(interrupts)
        self.on_interrupt = on_interrupt

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self.cond:
            self.now += seconds
            self.cond.notify_all()
        if self.now > self.limit:
            raise AssertionError(f"fake time reached {self.now:g} s and the code under test "
                                 "still sleeps: a loop that never ends (it would hang the real "
                                 "launcher too)")
        self.settle()
        if self.interrupts and self.now >= self.interrupts[0]:
            self.interrupts.pop(0)
            if self.on_interrupt is not None:
                self.on_interrupt()
            else:
                raise KeyboardInterrupt

    def settle(self) -> None:
        """Wait until every worker's reader has read all that is due now (or its output closed)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        with self.cond:
            for w in self.workers:  # woken: idle again only once it has looked at the time
                w.waiting = False
            self.cond.notify_all()
            while not all(w.idle() for w in self.workers):
                if time.monotonic() > deadline:
                    raise AssertionError("a fake worker's reader did not catch up: "
                                         + ", ".join(w.plan.label for w in self.workers if not w.idle()))
                self.cond.wait(timeout=0.001)  # a reader ending does not notify


def process_plan(process_id: int, log_dir: str, host: str = "localhost") -> ProcessPlan:
    return ProcessPlan(process_id=process_id, host=host, local_device_count=1, env={}, argv=(),
                       log_path=os.path.join(log_dir, f"process-{process_id:03d}.log"),
                       label=f"p{process_id}" if host == "localhost" else f"p{process_id} {host}")


class FakeWorker:
    """A scripted worker (``launcher.state.Worker``) living in ``clock``'s fake time.

    Args:
      clock: the FakeClock (the worker registers itself with it).
      plan: its ProcessPlan (``process_plan``).
      lines: ``(time, text)`` pairs: each line is output once the clock reaches its time.
      exit: how it ends by itself (an Exit); None: it runs until stopped.
      exit_at: fake time of that end.
      exit_after_polls: or: it ends at the N-th poll.
      eof_at: fake time its output closes, if before its end (else at its end).
      on_term: "exit" (ends ``term_delay`` seconds after SIGTERM, as ``term_exit``) or "ignore".
      stopped: it is stopped (SIGSTOP) until SIGTERM+SIGCONT or SIGKILL.
      stopped_until: or: stopped until this fake time (someone sends SIGCONT).
      stacks: the lines it answers a stacks request with (``dump_stacks``), ``stacks_delay``
        fake seconds later, unless it is stopped then; None: it never answers.
    """

    def __init__(self, clock: FakeClock, plan: ProcessPlan, lines=(), exit: Exit | None = None,
                 exit_at: float | None = None, exit_after_polls: int | None = None,
                 eof_at: float | None = None, on_term: str = "exit", term_delay: float = 0.0,
                 term_exit: Exit = Killed(signal.SIGTERM), stopped: bool = False,
                 stopped_until: float | None = None, stacks: list | None = None,
                 stacks_delay: float = 0.1, trace_ms_per_step: float | None = None):
        self.clock, self.plan = clock, plan
        self.script = sorted(lines, key=lambda item: item[0])
        self.exit_after_polls, self.eof_at = exit_after_polls, eof_at
        self.on_term, self.term_delay, self.term_exit = on_term, term_delay, term_exit
        self.is_stopped = stopped or stopped_until is not None
        self.stopped_until = stopped_until
        self.stacks, self.stacks_delay = stacks, stacks_delay
        self.trace_ms_per_step = trace_ms_per_step  # answers a profile request (None: never)
        self.profile_requests: list = []  # the texts request_profile was handed
        self.end = (exit_at, exit) if exit is not None and exit_at is not None else None
        self.pending_exit = exit
        self.polls = 0
        self.calls: list = []  # (what, fake time): "terminate", "kill", "stopped"
        self.reader: threading.Thread | None = None
        self.waiting = False
        clock.workers.append(self)

    # ---- what supervise calls --------------------------------------------------
    def lines(self):
        with self.clock.cond:
            self.reader = threading.current_thread()
        index = 0
        while True:
            with self.clock.cond:
                while True:
                    if index < len(self.script) and self.script[index][0] <= self.clock.now \
                            and not self._output_closed():
                        text = self.script[index][1]
                        index += 1
                        break
                    if self._output_closed():
                        return
                    self.waiting = True
                    self.clock.cond.notify_all()
                    self.clock.cond.wait()
                    self.waiting = False
            yield text

    def poll(self) -> Exit | None:
        self.polls += 1
        if self.end is None and self.exit_after_polls is not None and self.polls >= self.exit_after_polls:
            self._die(self.pending_exit)
        return self._ended()

    def terminate(self) -> None:
        self.calls.append(("terminate", self.clock.now))
        self.is_stopped = False  # terminate sends SIGCONT with SIGTERM
        if self.on_term == "exit" and self._ended() is None:
            at = self.clock.now + self.term_delay
            if self.end is None or at < self.end[0]:
                self.end = (at, self.term_exit)
                self.clock.settle()

    def kill(self) -> None:
        self.calls.append(("kill", self.clock.now))
        if self._ended() is None:
            self._die(Killed(signal.SIGKILL))

    def dump_stacks(self) -> None:
        self.calls.append(("dump_stacks", self.clock.now))
        if self.stacks is None or self._ended() is not None or self.is_stopped:
            return
        at = self.clock.now + self.stacks_delay
        with self.clock.cond:
            later = [item for item in self.script if item[0] > at]
            # the reader takes script lines by index: the answer goes before any later line
            self.script[len(self.script) - len(later):] = [(at, line) for line in self.stacks] + later
            self.clock.cond.notify_all()

    def request_profile(self, text: str, failed=None) -> None:
        """Take the request; with ``trace_ms_per_step``, say a trace of its steps 1 fake
        second later, as a worker does (``worker.contract.profiling.LINE_FORMAT``)."""
        self.calls.append(("request_profile", self.clock.now))
        self.profile_requests.append(text)
        if self.trace_ms_per_step is None or self._ended() is not None:
            return
        asked = json.loads(text)
        first, last = asked["start_step"], asked["start_step"] + asked["num_steps"] - 1
        line = profiling.LINE_FORMAT.format(
            first=first, last=last, session=asked["session"],
            seconds=self.trace_ms_per_step * (last - first + 1) / 1e3, ms_per_step=self.trace_ms_per_step,
            kept=os.path.relpath(profiling.trace_path(".", asked["session"], self.plan.process_id)))
        with self.clock.cond:
            at = self.clock.now + 1.0
            later = [item for item in self.script if item[0] > at]
            self.script[len(self.script) - len(later):] = [(at, line)] + later
            self.clock.cond.notify_all()

    def stopped(self) -> bool:
        self.calls.append(("stopped", self.clock.now))
        resumed = self.stopped_until is not None and self.stopped_until <= self.clock.now
        return self.is_stopped and not resumed and self._ended() is None

    # ---- for tests -----------------------------------------------------------------
    def called(self, what: str) -> list:
        """Fake times of every call of ``what`` ("terminate", "kill", "stopped")."""
        return [at for name, at in self.calls if name == what]

    def idle(self) -> bool:
        if self.reader is None:
            return False
        return self.waiting or not self.reader.is_alive()

    def _die(self, ended: Exit) -> None:
        self.end = (self.clock.now, ended)
        self.is_stopped = False
        self.clock.settle()

    def _ended(self) -> Exit | None:
        if self.end is not None and self.end[0] <= self.clock.now:
            return self.end[1]
        return None

    def _output_closed(self) -> bool:
        return (self.eof_at is not None and self.eof_at <= self.clock.now) or self._ended() is not None


class FakeTrainerJob(kinds.Trainer, types.SimpleNamespace):
    """A trainer job of only the fields a test gives, answering as ``TrainerJobSpec`` does
    (``launcher.spec.kinds.Trainer``: its command, environment, compilation cache)."""


class FakeReattach(Reattach):
    """A FakeSession's part in being taken back: its processes are FakeWorkers of the test's
    own making, so there are none to adopt and no strays; each call is recorded in ``events``."""

    def __init__(self, events: list):
        self.events = events

    def adopt(self, plan: planning.Plan, records: list) -> list:
        self.events.append(("adopt", len(records)))
        raise AssertionError("a FakeSession has no processes to take back")

    def stop_strays(self) -> list:
        self.events.append(("stop_strays",))
        return []


class FakeSession(Session):
    """A backend session whose ``start`` hands out FakeWorkers made by ``attempts[n](plan)``.

    Records every call in ``events``: ("plan", restart), ("start", plan), ("end_attempt",).
    """

    def __init__(self, job, run_dir: str, attempts, console=None):
        super().__init__(job, run_dir, console)
        self.attempts = list(attempts)
        self.events: list = []
        self.reattach = FakeReattach(self.events)

    def prepare(self, restart: bool = False):
        self.events.append(("plan", restart))
        placement = Placement(host="localhost", num_processes=self.job.num_processes,
                              local_device_count=1, platform="cpu", python="python3",
                              run_dir=self.run_dir, job_path=os.path.join(self.run_dir, "job.json"),
                              label_host=False)
        return (placement,), "127.0.0.1:1"

    def describe_start(self, plan: planning.Plan) -> str:
        return f"starting {plan.num_processes} fake processes"

    def start(self, plan: planning.Plan) -> list:
        self.events.append(("start", plan))
        return self.attempts.pop(0)(plan)

    def end_attempt(self) -> None:
        self.events.append(("end_attempt",))
