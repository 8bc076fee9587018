"""Helpers for your own program run by podlaunch (a ``program:`` job): join, report, done.

A program job runs the user's command as every process's worker. Nothing here
is required: a program that calls ``jax.distributed.initialize()`` itself (it
reads ``JAX_COORDINATOR_ADDRESS``) and never reports still gets prefixed logs,
fail-fast, teardown and exit-code-based restarts. With these helpers it gets
the rest of what the built-in trainer has::

    from podlaunch import program

    jax = program.initialize()           # join with every value explicit, check the topology
    for step in range(1, num_steps + 1):
        loss = ...
        program.report(step, loss=loss)  # status line, watchdog, TensorBoard (process 0)

* ``initialize()``: ``jax.distributed.initialize`` with the launcher's
  coordinator address, process count and id (``worker.runtime.joining.join``: the same
  JOINING lines and the same post-init check as the trainer: exit 3 with the
  same message when JAX disagrees with the plan).
* ``report(step, **scalars)``: at log steps (``logging.log_every_steps``, and
  the last step ``program.num_steps``) a progress line the launcher parses
  (status line, per-process step times, "finished"), and on process 0
  TensorBoard scalars and ``metrics.jsonl``, with every process's step time
  (``step_time_s/process_NNN``, through JAX's coordination service, no device
  collective); between them heartbeats for the stall watchdog.
* ``done()``: says the program completed (``wire.Done``), e.g. when it
  stops before ``num_steps`` on purpose. Reporting the last step says so too.
* ``stop_after(step)`` after every step, and ``preempted()`` once it returned True and
  the program saved that step: a preemption notice (SIGTERM) to any process becomes one
  step every process stops after (``worker.recovery.notice``).

An exit 0 after reporting steps, but before the last one and without ``done()``,
is a failure (the launcher names it), as for the trainer.

Where things are (environment): ``PODLAUNCH_RUN_DIR`` (``run_dir()``),
``checkpoint_dir()`` (``<run dir>/checkpoints``), ``PODLAUNCH_ATTEMPT``
(``attempt()``), ``PODLAUNCH_RESUME`` (``resuming()``: restore your latest
checkpoint).
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import sys
import time

from worker import contract
from worker.contract import causes, signals, wire
from worker.contract import job as jobs
from worker.runtime import channel, interrupts

_state: dict = {}


def identity() -> contract.Identity:
    """This process's identity as the launcher planned it (``contract.Identity.from_env``)."""
    return contract.Identity.from_env(os.environ)


def run_dir() -> str:
    """The run directory as this host sees it (TensorBoard and logs of process 0 go there)."""
    return identity().run_dir


def checkpoint_dir() -> str:
    """Where the program's own checkpoints belong: ``<run dir>/checkpoints`` (over ssh the
    launcher mirrors ``step-NNNNNNN`` directories of host 0 back, see docs/recovery.md)."""
    return os.path.join(run_dir(), contract.CHECKPOINTS_DIR)


def attempt() -> int:
    """0 for the first attempt, n for the n-th restart."""
    return identity().attempt


def resuming() -> bool:
    """Whether this attempt continues an earlier one (a restart or ``--resume``)."""
    return identity().resume


def _job() -> jobs.ProgramJob:
    if "job" not in _state:
        _state["job"] = jobs.ProgramJob.from_json(identity().job_path)
    return _state["job"]


def _exit_now(code: int) -> None:
    channel.flush()
    os._exit(code)


def _terminated(signum: int) -> None:
    # The launcher's TERM (a peer failed, Ctrl-C) unwinds the program as SystemExit (its
    # finally blocks run) as in the trainer (worker.runtime.interrupts); _at_exit then writes what
    # process 0 holds and exits at once, skipping JAX's shutdown barrier (it would wait
    # minutes for peers that are gone). Writing from the handler instead could deadlock on
    # a lock the interrupted code holds (the TensorBoard writer's, a file's).
    _state["terminated"], _state["exit_code"] = True, signals.exit_code(signum)


def initialize(num_steps: int | None = None):
    """Join JAX like the built-in worker and check what JAX reports against the plan.

    Args:
      num_steps: steps this program will ``report`` (default: the spec's ``program.num_steps``).

    Returns:
      The ``jax`` module, joined.

    Exits (never returns) with ``contract.EXIT_MISMATCH`` (3) when the identity in the
    environment is missing or JAX disagrees with the launcher's plan, and with
    ``contract.EXIT_INIT`` (4) when ``jax.distributed.initialize`` raises.

    A second call (a library and the program both calling it) returns the same joined
    ``jax``, with ``num_steps`` updated if given: JAX allows one
    ``jax.distributed.initialize`` per process and raised a RuntimeError for the second.
    """
    if "identity" in _state:
        import jax

        if num_steps is not None:
            _state["num_steps"] = num_steps
        return jax
    from worker.runtime import joining

    channel.keep()  # the launcher's lines go where stdout is now, whatever the program does
    try:
        me = identity()
        job = _job()
        jax = joining.join(me, job)
    except contract.ContractError as exc:
        channel.say(causes.line(causes.MISMATCH, str(exc)))
        _exit_now(contract.EXIT_MISMATCH)
    # jax.distributed.initialize installs a SIGTERM handler that swallows the launcher's TERM
    interrupts.install(on_signal=_terminated)
    interrupts.answer_stack_requests()  # launcher.run.stacks: what a hung run was doing
    if joining.single_process(me):
        channel.say("process 0/1: one process, in-process collectives (no jax.distributed)")
    else:
        channel.say(wire.Joined(jax.process_index(), jax.process_count(),
                                me.coordinator_address).text())
    _state.update(identity=me, num_steps=num_steps or job.program.num_steps)
    atexit.register(_at_exit)  # after JAX's own: runs before its shutdown barrier
    sys.excepthook = _on_uncaught
    _state["sys_exit"] = sys.exit
    sys.exit = _sys_exit  # the code of sys.exit(n), which atexit hooks are not told
    return jax


def _sys_exit(code=0):
    _state["exit_code"] = code
    _state["sys_exit"](code)


def _at_exit() -> None:
    """At a normal interpreter exit: write what process 0 holds; after the launcher's SIGTERM,
    or after reporting some steps but not the last (and no ``done()``), exit at once, skipping JAX's shutdown barrier,
    which would wait for peers that are waiting for this process in a collective."""
    # exiting already: a TERM now ends the process at once (a SystemExit raised in an atexit
    # hook is only printed, and the next hook is JAX's shutdown barrier)
    signal.signal(signal.SIGTERM, lambda signum, frame: _exit_now(signals.exit_code(signum)))
    if _state.get("notice") is not None:  # its watcher out of JAX's client before JAX's shutdown
        _state["notice"].close()
    reporter = _state.get("reporter")
    early = (reporter is not None and reporter.last_step < reporter.num_steps
             and not _state.get("done"))
    if _state.get("terminated"):
        _close(wait_s=0.5)
        _exit_now(_state.get("exit_code", signals.exit_code(signal.SIGTERM)))
    _close(wait_s=0.5 if early else 60.0)
    if early:
        code = _state.get("exit_code", 0)
        _exit_now(code if isinstance(code, int) else 1)


def _on_uncaught(kind, exc, tb) -> None:
    """An uncaught error after joining: say when and at which step (the launcher's root
    cause orders a cascade by it), write what process 0 holds, and exit 1 at once,
    skipping JAX's shutdown barrier (peers stuck in a collective would hold it)."""
    import traceback

    traceback.print_exception(kind, exc, tb)
    reporter = _state.get("reporter")
    channel.say(wire.FailedAt(time.time()).text())
    channel.say(wire.Failed(reporter.last_step if reporter else 0,
                            f"{kind.__name__}: {exc}").text())
    full = causes.disk_full(exc) if isinstance(exc, OSError) else None
    ran_out = causes.exhausted(exc) if isinstance(exc, OSError) else None
    if full:  # the class and the advice come from this line (worker.contract.causes), not exit 1
        channel.say(causes.line(causes.DISK_FULL, full))
    elif ran_out:
        channel.say(causes.line(causes.EXHAUSTED, ran_out))
    _close(wait_s=0.5)
    _exit_now(1)


class _Reporter:
    """Progress lines, heartbeats, and process 0's TensorBoard scalars for ``report``."""

    def __init__(self, me: contract.Identity, job: jobs.ProgramJob, num_steps: int):
        from worker.telemetry.records import Records
        from worker.telemetry.tracker import make_tracker
        from worker.trainer.calls import InFlight

        self.me, self.num_steps = me, num_steps
        self.log_every = job.logging.log_every_steps
        self.interval_s = wire.heartbeat_interval_s(job.watchdog.stall_timeout_s)
        self.tracker = make_tracker(me.run_dir, me.process_id, job.logging.tensorboard)
        self.gather = None
        if job.logging.tensorboard and me.num_processes > 1:
            from worker.runtime.gather import KeyValueGather

            self.gather = KeyValueGather(me.process_id, me.num_processes)
        # process 0: each step's record held until every process's time is in (as the trainer's)
        self.records = Records(self.tracker, self.gather, me.process_id, me.num_processes,
                               num_steps, {"num_steps": num_steps})
        # at most 2 reported steps queued on the devices, as the trainer: unbounded, steps of
        # a 2 x 2 CPU run interleave on XLA's thread pool and deadlock in gloo's all-reduce
        self.in_flight = InFlight(max_calls=2)
        self.mark = time.perf_counter()
        self.mark_step = 0
        self.last_beat = -math.inf
        self.last_step = 0
        self.laid_out = False
        self.profiler = _profiler(me, job, num_steps)

    def report(self, step: int, scalars: dict) -> None:
        self.in_flight.add(list(scalars.values()))  # waits for step - 2's (JAX arrays)
        # a trace ends after its last step's scalars are ready, and starts before the next step
        self.profiler.after(step, _ready, scalars)
        self.profiler.before(step + 1, step + 1)
        now = time.perf_counter()
        self.last_step = step
        if not (step % self.log_every == 0 or step == self.num_steps):
            if self.interval_s is not None and now - self.last_beat >= self.interval_s:
                channel.say(wire.Heartbeat(step).text())
                self.last_beat = now
            return
        with interrupts.held():  # a progress line printed is a record written or held
            self._log(step, scalars)

    def _log(self, step: int, scalars: dict) -> None:
        values = {k: float(v) for k, v in scalars.items()}  # waits for device values: a sync
        now = time.perf_counter()
        steps = max(1, step - self.mark_step)
        step_time_s = (now - self.mark) / steps
        self.mark, self.mark_step = now, step
        loss = values.get("loss", math.nan)
        # a program's own host time is not told apart from JAX's: both numbers are the wall time
        own = tuple((name, value) for name, value in values.items() if name != "loss")
        if not self.laid_out:  # TensorBoard's landing view: the loss, then the program's own
            self.tracker.layout(tuple(name for name, _ in own))
            self.laid_out = True
        channel.say(wire.Progress(step, self.num_steps, loss, 1.0 / step_time_s, step_time_s,
                                  step_time_s, own).text())
        self.last_beat = now
        values["step_time_s"] = step_time_s
        if step == self.num_steps and "loss" in values:
            values["final_loss"] = loss
        self.records.add([(step, step_time_s, values)])

    def close(self, wait_s: float) -> None:
        self.profiler.close()
        self.records.drain(wait_s, ending=True)
        self.tracker.close()


def _profiler(me: contract.Identity, job: jobs.ProgramJob, num_steps: int):
    """The program's ``worker.telemetry.profiler.Profiler``: the spec's ``profile`` and ``launch profile``'s
    requests, traced from one ``report`` to another (the first traced step is the second
    reported one at the earliest: a trace starts at a report)."""
    from worker.runtime.joining import client_of
    from worker.telemetry.profiler import Profiler

    return Profiler(me.run_dir, me.process_id, me.num_processes, job.profile, client_of(me),
                    channel.say, num_steps)


def _ready(scalars: dict) -> None:
    import jax

    jax.block_until_ready(list(scalars.values()))


def report(step: int, **scalars) -> None:
    """Report that ``step`` (counting from 1) is done, with its scalars (``loss=...``).

    Every call is cheap except at log steps (every ``logging.log_every_steps`` and the last
    step), where the scalars are read (a device sync for JAX arrays) and printed as the
    launcher's progress line; process 0 also writes them to TensorBoard and metrics.jsonl;
    and at the last step of a profiled window (``profile``, ``launch profile``), which waits
    for the step's scalars and writes the trace (``worker.telemetry.profiler``).
    It keeps at most two reported steps queued on the devices: it waits for the scalars
    of step ``step - 2`` (``jax.block_until_ready``), as the trainer does
    (``worker.trainer.calls.InFlight``), since unbounded asynchronous dispatch deadlocks
    multi-device CPU runs in gloo's all-reduce. Pass the step's outputs (``loss=...``) so
    that waiting for them means the step finished.

    Raises:
      RuntimeError: ``initialize`` was not called, or no ``num_steps`` is known.
    """
    if "identity" not in _state:
        raise RuntimeError("worker.program.report: call worker.program.initialize() first")
    reporter = _state.get("reporter")
    if reporter is None:
        num_steps = _state["num_steps"]
        if not num_steps:
            raise RuntimeError("worker.program.report needs the number of steps: set "
                               "program.num_steps in the spec or pass "
                               "initialize(num_steps=...)")
        reporter = _state["reporter"] = _Reporter(_state["identity"], _job(), num_steps)
    reporter.report(step, scalars)


def resumed_from(step: int, seconds: float = 0.0) -> None:
    """Say that this attempt continues after ``step`` (a checkpoint the program restored,
    in ``seconds``): the launcher's status line, step times and goodput ledger then count
    from it (``wire.Resumed``), not from step 0."""
    channel.say(wire.Resumed(step, attempt(), seconds).text())


def stop_after(step: int) -> bool:
    """Whether every process agreed to stop after ``step`` for a preemption notice.

    Call it after every step, with consecutive steps. From the first call on, a SIGTERM
    (to this process, to the launcher, which SIGTERMs every worker, or Slurm's to every
    task) is a notice instead of an exit: every process's watcher agrees on one step
    (``worker.recovery.notice``: the maximum step any process reported, plus one, since a process
    may already be in the next step), and this returns True on every process at that
    step. Then save that step's checkpoint (process 0, to ``checkpoint_dir()``) and call
    ``preempted()``; the restart resumes from it. Without a notice a call costs one lock.
    A SIGTERM before the first call ends the program as before.

    Raises:
      SystemExit: 143 when no agreement came within ``checkpoint.notice_grace_s`` (a
        process that did not answer: dead, or stuck in a collective); said first. Save
        nothing then: the restart resumes from the checkpoint before.
    """
    notice = _state.get("notice")
    if notice is None:
        if "identity" not in _state:
            raise RuntimeError("worker.program.stop_after: call worker.program.initialize() first")
        notice = _state["notice"] = _start_notice(_state["identity"])
    if notice.may_dispatch(step):
        if notice.stop_step == step:
            channel.say(notice.line("; the program saves it"))
            return True
        return False
    channel.say(notice.line())
    _state["terminated"], _state["exit_code"] = True, signals.exit_code(signal.SIGTERM)
    raise SystemExit(_state["exit_code"])


def _start_notice(me: contract.Identity):
    from worker.recovery.notice import Notice
    from worker.runtime.joining import client_of

    notice = Notice(me.process_id, me.num_processes, _job().checkpoint.notice_grace_s,
                    client_of(me), lead=1)
    notice.start()
    _state["notices"] = interrupts.notices(notice.signalled)
    _state["notices"].__enter__()  # for the rest of the program: see stop_after
    return notice


def preempted() -> None:
    """After ``stop_after`` returned True and the program saved its checkpoint: write what
    process 0 holds, wait until every process got here (a process that leaves first makes
    JAX abort the others, a save with them), leave JAX's coordination service and exit 143,
    a preemption, which the launcher restarts at once from that checkpoint."""
    _close(wait_s=5.0)
    notice = _state.get("notice")
    if notice is not None:
        notice.leave()
    _exit_now(signals.exit_code(signal.SIGTERM))


def done() -> None:
    """Say the program completed (the launcher counts its exit 0 as a success)."""
    _close(wait_s=60.0)
    _state["done"] = True
    channel.say(wire.Done().text())


def _close(wait_s: float = 60.0) -> None:
    """Write what process 0 holds (once): at ``done()``, at exit, on SIGTERM."""
    reporter = _state.pop("reporter", None)
    if reporter is not None:
        reporter.close(wait_s)
