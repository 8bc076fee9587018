"""Supervision without processes: fake workers, a fake clock, the real supervise and restarts.

Each test drives ``launcher.run.supervise.supervise`` (or ``launcher.run.restarts.run``)
through scripted ``tests.fakes.FakeWorker``s in fake time, so fail-fast,
root-cause ordering, the stall watchdog, teardown and restarts run in
milliseconds. Assertions are on what the product did: states, the first
failure it chose, its messages, and when it sent TERM and KILL.
"""

from __future__ import annotations

import functools
import io
import os
import re
import signal
import types

import pytest

from harness.fakes import FakeClock, FakeSession, FakeTrainerJob, FakeWorker, process_plan
from launcher.console import lines
from launcher import logtimes, spec as specs
from launcher.run import classes, restarts, stacks
from launcher.run.classes import FailureClass
from launcher.run import supervise as supervision
from launcher.console import Console
from launcher.ends import Exited, Killed, Stalled
from launcher.state import State, Watchdog
from launcher.console.status import summary
from worker import contract
from worker.contract import wire

POLL_S = 0.05
KILLED, OK = Killed(signal.SIGKILL), Exited(0)


def progress(step: int, num_steps: int = 100) -> str:
    return wire.PROGRESS_FORMAT.format(step=step, num_steps=num_steps, loss=0.5, steps_per_s=10.0,
                                           step_time_s=0.1, own_step_time_s=0.01)


# a worker's answer to a stacks request (launcher.run.stacks), as faulthandler writes it
DUMP = ["Current thread 0x00007f0000000001 (most recent call first):",
        '  File "/home/me/task.py", line 7 in on_step_end']


def heartbeat(step: int) -> str:
    return wire.HEARTBEAT_FORMAT.format(step=step)


class Run:
    """One supervised run in fake time: workers, a console that records, the Result."""

    def __init__(self, tmp_path, **clock_args):
        self.clock = FakeClock(**clock_args)
        self.log_dir = str(tmp_path)
        self.out = io.StringIO()
        self.console = Console(self.out, tty=False, status_every_s=0)
        self.workers: list = []

    def worker(self, **script) -> FakeWorker:
        w = FakeWorker(self.clock, process_plan(len(self.workers), self.log_dir), **script)
        self.workers.append(w)
        return w

    def supervise(self, grace_s: float = 3.0, watchdog: Watchdog | None = None):
        self.result = supervision.supervise(self.workers, grace_s, self.console, poll_interval_s=POLL_S,
                                            watchdog=watchdog, clock=self.clock, sleep=self.clock.sleep)
        return self.result

    @property
    def said(self) -> list:
        return [line[len("podlaunch: "):] for line in self.out.getvalue().splitlines()
                if line.startswith("podlaunch: ")]

    def states(self) -> list:
        return [t.state for t in self.result.processes]


def test_every_worker_succeeds_and_each_line_reaches_its_log_and_the_console(tmp_path):
    run = Run(tmp_path)
    # a success says so: its last step's line (p0) or "done" (p1)
    run.worker(lines=[(0.5, progress(10, 20)), (0.7, heartbeat(15)), (0.9, progress(20, 20))],
               exit=Exited(0), exit_at=1.0)
    run.worker(lines=[(0.6, progress(10, 20)), (1.1, "done")], exit=Exited(0), exit_at=1.2)
    result = run.supervise()
    assert result.exit_code == 0 and result.first_failure is None and not result.interrupted
    assert run.states() == [State.SUCCEEDED, State.SUCCEEDED]
    assert [t.last_step for t in result.processes] == [20, 10]  # the heartbeat counted as progress
    assert 1.2 <= result.elapsed_s < 1.2 + 2 * POLL_S
    shown = run.out.getvalue().splitlines()
    assert shown == [f"[p0] {progress(10, 20)}", f"[p1] {progress(10, 20)}", f"[p0] {progress(20, 20)}",
                     "[p1] done"]
    # heartbeats are neither logged nor shown
    assert logtimes.read_text(result.processes[0].plan.log_path).splitlines() == [
        progress(10, 20), progress(20, 20)]
    assert all(not w.called("terminate") and not w.called("kill") for w in run.workers)
    assert "OK: 2 processes succeeded" in summary(result)


def test_one_failure_stops_the_others_with_term_then_kill_after_grace(tmp_path):
    run = Run(tmp_path)
    polite = run.worker(term_delay=0.5)                  # exits 0.5 s after SIGTERM
    run.worker(lines=[(0.2, progress(7)), (0.9, "Traceback: boom")], exit=Exited(1), exit_at=1.0)
    stubborn = run.worker(on_term="ignore")              # only SIGKILL ends it
    result = run.supervise(grace_s=3.0)

    assert result.exit_code == 1 and result.first_failure is result.processes[1]
    assert run.states() == [State.STOPPED, State.FAILED, State.STOPPED]
    [term] = polite.called("terminate")
    assert stubborn.called("terminate") == [term]
    assert 1.0 <= term < 1.0 + 0.3 + 3 * POLL_S        # after the root-cause window, not later
    assert polite.called("kill") == []                   # it left within the grace period
    [kill] = stubborn.called("kill")
    assert kill - term == pytest.approx(3.0, abs=2 * POLL_S)
    assert result.processes[2].exit == Killed(signal.SIGKILL)
    assert run.said[:2] == ["p1 failed (exit code 1); stopping the other 2 processes",
                            "sending SIGKILL to p2 (still running 3s after SIGTERM)"]
    report = summary(result)
    assert report.startswith("FAILED: process_id 1 on localhost (exit code 1) after step 7, "
                             "its last logged step; it failed first.")
    assert "  | Traceback: boom" in report


def test_a_long_line_is_logged_whole_and_shown_and_summarised_shortened(tmp_path):
    """A line in ``Piece``s (the ssh reader's over-long line) or one longer than the
    console's cap: the log has every character, the console and the summary a head and
    its length, and the lines around it are untouched."""
    run = Run(tmp_path)
    pieces = [(0.1 + i / 100, lines.Piece(chr(ord("a") + i) * 70_000)) for i in range(10)]
    run.worker(lines=[(0.05, progress(1)), *pieces, (0.3, "z"), (0.4, "y" * 50_000),
                      (0.5, progress(2))], exit=Exited(1), exit_at=0.6)
    result = run.supervise()
    logged = logtimes.read_text(result.processes[0].plan.log_path).splitlines()
    whole = "".join(p for _, p in pieces) + "z"
    assert logged == [progress(1), whole, "y" * 50_000, progress(2)]
    shown = run.out.getvalue()
    cap = lines.MAX_SHOWN_CHARS
    assert f"[p0] {whole[:cap]} [... line cut: 700,001 characters in all" in shown
    assert f"[p0] {'y' * cap} [... line cut: 50,000 characters in all" in shown
    assert f"[p0] {progress(2)}" in shown and len(shown) < 4 * cap + 2000
    report = summary(result)
    assert "after step 2" in report and len(report) < 4 * cap + 2000


def test_the_root_cause_is_the_earliest_end_its_host_reported_not_the_first_noticed(tmp_path):
    run = Run(tmp_path)
    # p0's exit is noticed first, p1's 0.15 s later, but p1's host says it ended first.
    run.worker(exit=Exited(1, at=1700000000.30), exit_at=1.0)
    run.worker(exit=Killed(signal.SIGKILL, at=1700000000.10), exit_at=1.15)
    result = run.supervise()
    assert result.first_failure is result.processes[1]
    assert run.said[0] == "p1 failed (killed by SIGKILL)"  # none left running: no "other 0"
    assert summary(result).startswith("FAILED: process_id 1 on localhost (killed by SIGKILL)")
    assert "clock" not in summary(result)  # clocks in step (both far from this machine's) say nothing
    # the cascade's exit 1 was reported first, yet the attempt's class is p1's SIGKILL
    verdict = classes.classify(result)
    assert verdict.failure_class is FailureClass.INFRASTRUCTURE and verdict.process_id == 1


def test_a_host_whose_clock_is_60_s_behind_does_not_lead_the_cascade(tmp_path):
    """Issue 71: one host's clock 60 s behind named the wrong host first (its victim's end,
    by its own clock, came before the cause's) and filed the run as an infrastructure fault.
    Clocks that disagree by more than the lag of a report cannot order ends: the order this
    machine saw them in decides."""
    run = Run(tmp_path)
    run.worker(exit=Exited(1, at=1700000000.10), exit_at=1.0)               # the cause
    run.worker(exit=Killed(signal.SIGKILL, at=1700000000.30 - 60), exit_at=1.15)  # 60 s behind
    result = run.supervise()
    assert result.first_failure is result.processes[0]
    report = summary(result)
    assert report.startswith("FAILED: process_id 0 on localhost (exit code 1)")
    # and the host whose clock is off is named, the others not
    assert "note: localhost's clock (process_id 1) is about 60 s behind the others'" in report
    assert "(process_id 0) is about" not in report
    verdict = classes.classify(result)
    assert verdict.process_id == 0 and verdict.failure_class is not FailureClass.INFRASTRUCTURE


def test_a_process_that_lost_a_peer_is_a_consequence_even_when_its_time_is_earlier(tmp_path):
    """Under load a wrapper notices its worker's exit late; the victims' own catch times are
    then earlier than the cause's end. Their words say they lost a peer: they do not lead."""
    run = Run(tmp_path)
    gloo = "jax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: Connection closed by peer"
    run.worker(lines=[(0.9, "podlaunch-failed-at 1700000000.100000"), (0.9, gloo)],
               exit=Exited(1, at=1700000000.20), exit_at=1.0)
    run.worker(lines=[(0.5, "step 5/100 loss 0.1 | 10.0 steps/s")],
               exit=Exited(0, at=1700000000.30), exit_at=1.05)       # exited 0 early: the cause
    run.worker(lines=[(0.9, "podlaunch-failed-at 1700000000.110000"),
                      (0.9, "RuntimeError: Connection reset by peer")],
               exit=Exited(1, at=1700000000.25), exit_at=1.1)
    result = run.supervise()
    assert result.first_failure is result.processes[1]
    assert summary(result).startswith("FAILED: process_id 1 on localhost (exit code 0 before")


def test_a_cause_seen_after_its_cascade_still_leads(tmp_path):
    """The cause's end reaches the launcher 0.8 s after its peers' reactions (an exit report
    queued behind a long line on an SSH channel, a loaded host): past the 0.3 s window, but
    every failure seen by then says it lost a peer, so the launcher waits for the cause."""
    run = Run(tmp_path)
    gloo = "jax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: Connection closed by peer"
    run.worker(lines=[(0.95, gloo)], exit=Exited(1), exit_at=1.0)
    run.worker(exit=Killed(signal.SIGKILL), exit_at=1.8)           # the cause, seen late
    run.worker(on_term="exit", term_exit=Killed(signal.SIGTERM))   # blocked in a collective
    result = run.supervise()
    assert result.first_failure is result.processes[1]
    assert run.said[0] == "p1 failed (killed by SIGKILL); stopping the other 1 process"
    assert run.states() == [State.FAILED, State.FAILED, State.STOPPED]


def test_a_peer_cut_off_at_a_coordination_barrier_waits_for_the_cause(tmp_path):
    """Issue 51.10 (a CI flake, in fake time): process 0 exits with a data error while
    process 1 waits at a coordination barrier; process 1's traceback ends in the coordination
    service's "Failed to send RPC ... Socket closed", which has no gloo or peer-loss marker,
    and its end is seen first. The cause search reads consequences as the verdict does, so
    process 0 still leads the summary (it named process 1 first under load)."""
    run = Run(tmp_path)
    barrier = ["Traceback (most recent call last):",
               "  File \"/w/worker/recovery/localtier.py\", line 83, in writes_copies",
               "jax.errors.JaxRuntimeError: UNAVAILABLE: Failed to send RPC to coordination "
               "service. Either the leader task was preempted/died/restarted unexpectedly or "
               "this task is experiencing network issues.",
               ":UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:\"Socket closed\"}"]
    run.worker(lines=[(1.7, "worker: data error: d.npy: row 11 (0-based), column 3: nan is "
                            "not a finite number [data]")],
               exit=Exited(contract.EXIT_DATA), exit_at=1.8)        # the cause, seen late
    run.worker(lines=[(0.95, line) for line in barrier], exit=Exited(1), exit_at=1.0)
    result = run.supervise()
    assert result.first_failure is result.processes[0]
    assert summary(result).startswith("FAILED: process_id 0 on localhost (exit code 5)")
    assert classes.classify(result).process_id == 0


def test_a_cascade_without_a_cause_in_sight_is_stopped_after_cause_wait_s(tmp_path):
    run = Run(tmp_path)
    gloo = "jax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: Connection closed by peer"
    run.worker(lines=[(0.95, gloo)], exit=Exited(1), exit_at=1.0)
    blocked = run.worker(on_term="exit", term_exit=Killed(signal.SIGTERM))
    result = run.supervise()
    assert result.first_failure is result.processes[0]  # nothing better was seen
    terminated = blocked.called("terminate")
    assert terminated and 1.0 + 0.3 + 3.0 <= terminated[0] <= 1.0 + 0.3 + 3.0 + 0.5, terminated


def test_without_host_times_the_root_cause_is_the_output_that_closed_first(tmp_path):
    run = Run(tmp_path)
    run.worker(exit=Exited(1), exit_at=1.0)                        # output closes at 1.0
    run.worker(exit=Killed(signal.SIGKILL), exit_at=1.2, eof_at=0.9)  # closed at 0.9, reaped late
    result = run.supervise()
    assert result.first_failure is result.processes[1]
    assert run.states() == [State.FAILED, State.FAILED]
    assert result.processes[1].eof_at < result.processes[0].eof_at


def test_a_failure_noticed_after_the_root_cause_window_does_not_lead(tmp_path):
    run = Run(tmp_path)
    run.worker(exit=Exited(1), exit_at=1.0)
    run.worker(on_term="exit", term_exit=Killed(signal.SIGTERM), eof_at=0.5)  # quiet, not failed
    result = run.supervise()
    assert result.first_failure is result.processes[0]  # p1 ended only because it was stopped
    assert run.states() == [State.FAILED, State.STOPPED]


def test_a_worker_that_ends_at_its_nth_poll_is_noticed_then(tmp_path):
    run = Run(tmp_path)
    w = run.worker(exit=Exited(2), exit_after_polls=4)
    result = run.supervise()
    assert w.polls == 4 and result.first_failure is result.processes[0]
    assert result.processes[0].ended_at == pytest.approx(4 * POLL_S)


def test_the_stall_watchdog_names_a_stopped_worker_over_its_blocked_peers(tmp_path):
    run = Run(tmp_path)
    # p1 is stopped (SIGSTOP) after step 10; p0 waits for it in a collective. p0's last
    # heartbeat is older (heartbeats have their own phase), so p0 crosses the limit first.
    peer = run.worker(lines=[(0.9, heartbeat(10))], stacks=DUMP)  # answers in 0.1 s
    stopped = run.worker(lines=[(1.0, heartbeat(10))], stopped=True)
    result = run.supervise(watchdog=Watchdog(stall_timeout_s=5.0, first_step_timeout_s=100.0))

    assert result.first_failure is result.processes[1]
    assert run.states() == [State.STOPPED, State.FAILED]
    first = result.processes[1]
    assert isinstance(first.exit, Stalled) and "stopped" in first.exit.what
    message = run.said[0]
    assert re.match(r"^p1 stalled: no step progress for 5\.\d s \(the process is stopped, e\.g\. by "
                    r"SIGSTOP\) \(stall_timeout_s 5\); last step seen of every process: "
                    r"p0 10 \(5\.\d s ago\), p1 10 \(5\.\d s ago\); killing every process", message), message
    # SIGKILL at once, to both, and no SIGTERM: a stopped process cannot act on it; not
    # when p0 crossed the limit (5.9) but when p1 did (6.0), once p0's stacks are read
    # (its answer 0.1 s after the request, then stacks.QUIET_S without more of it)
    [kill] = stopped.called("kill")
    assert peer.called("kill") == [kill] and 6.0 < kill <= 6.0 + 0.1 + stacks.QUIET_S + 3 * POLL_S
    assert peer.called("dump_stacks") and not stopped.called("dump_stacks")
    assert peer.called("terminate") == stopped.called("terminate") == []
    verdict = classes.classify(result)
    assert verdict.failure_class is FailureClass.STALL
    assert verdict.why.startswith("process_id 1 on localhost stalled (no step progress for ")


def test_a_stopped_worker_that_resumes_before_its_own_limit_is_no_stall(tmp_path):
    run = Run(tmp_path)
    # p0 crosses its limit at 5.88 while p1 is stopped; p1 resumes at 5.97, before its own.
    run.worker(lines=[(0.88, heartbeat(10)), (5.97, progress(11)), (6.9, "done")], exit=OK, exit_at=7.0)
    run.worker(lines=[(1.0, heartbeat(10)), (5.97, progress(11)), (6.9, "done")], exit=OK, exit_at=7.0,
               stopped_until=5.97)
    result = run.supervise(watchdog=Watchdog(stall_timeout_s=5.0, first_step_timeout_s=100.0))
    assert result.exit_code == 0 and run.said == []


def test_a_process_that_finished_training_is_given_time_to_end(tmp_path):
    # step 100/100 said, then JAX's shutdown waits for the peer for 6 s: no stall at a
    # stall_timeout_s of 2 (the shutdown bound, blame.FINISHED_SHUTDOWN_S, applies)
    run = Run(tmp_path)
    run.worker(lines=[(0.5, progress(100)), (6.8, "done")], exit=OK, exit_at=7.0)
    run.worker(lines=[(0.5, progress(99)), (0.7, progress(100)), (6.8, "done")], exit=OK,
               exit_at=7.0)
    result = run.supervise(watchdog=Watchdog(stall_timeout_s=2.0, first_step_timeout_s=100.0))
    assert result.exit_code == 0 and run.said == []
    # a peer that has not finished is still caught at its own limit
    run = Run(tmp_path)
    run.worker(lines=[(0.5, progress(100))], exit=OK, exit_at=30.0)
    run.worker(lines=[(0.5, progress(99))])
    result = run.supervise(watchdog=Watchdog(stall_timeout_s=2.0, first_step_timeout_s=100.0))
    assert result.first_failure is result.processes[1]
    assert run.said[0].startswith("p1 stalled: no step progress for 2.")


def test_without_a_stopped_worker_the_stall_names_the_oldest_progress(tmp_path):
    run = Run(tmp_path)
    run.worker(lines=[(1.0, progress(10))])
    late = run.worker(lines=[(0.8, progress(10))])
    result = run.supervise(watchdog=Watchdog(stall_timeout_s=5.5, first_step_timeout_s=100.0))
    assert result.first_failure is result.processes[1] and late.called("stopped")
    assert run.said[0].startswith("p1 stalled: no step progress for 5.5 s (stall_timeout_s 5.5); ")


def test_the_first_step_timeout_applies_before_the_first_step_and_heartbeats_count(tmp_path):
    run = Run(tmp_path)
    run.worker(stacks=DUMP)  # silent since start: imports, compile... or hung
    run.worker(lines=[(0.5, progress(1))] + [(0.5 + k, heartbeat(1)) for k in range(1, 20)],
               stacks=DUMP)
    result = run.supervise(watchdog=Watchdog(stall_timeout_s=2.0, first_step_timeout_s=3.0))
    assert result.first_failure is result.processes[0]
    assert re.match(r"^p0 stalled: no first step after 3\.\d s \(first_step_timeout_s 3\); last step "
                    r"seen of every process: p0 none, p1 1 \(0\.\d s ago\)", run.said[0]), run.said[0]
    assert 3.0 < result.elapsed_s < 3.0 + 0.1 + stacks.QUIET_S + 4 * POLL_S  # the stacks first


def test_heartbeats_keep_a_slow_worker_alive_past_the_stall_timeout(tmp_path):
    run = Run(tmp_path)
    run.worker(lines=[(0.5, progress(1))] + [(0.5 + k, heartbeat(1)) for k in range(1, 12)]
               + [(12.0, progress(2)), (12.1, "done")], exit=Exited(0), exit_at=12.5)
    result = run.supervise(watchdog=Watchdog(stall_timeout_s=2.0, first_step_timeout_s=3.0))
    assert result.exit_code == 0 and run.said == []


def test_an_early_exit_0_while_peers_run_is_the_first_failure_not_a_success(tmp_path):
    run = Run(tmp_path)
    run.worker(lines=[(0.5, progress(10))])                                # blocked later
    run.worker(lines=[(0.5, progress(10))], exit=Exited(0), exit_at=1.0)  # left at step 10
    result = run.supervise()
    assert result.exit_code == 1 and result.first_failure is result.processes[1]
    assert run.states() == [State.STOPPED, State.FAILED]
    assert str(result.processes[1].exit) == ("exit code 0 before its last step (last logged step 10 "
                                             "of 100; it never said done)")
    assert summary(result).startswith("FAILED: process_id 1 on localhost (exit code 0 before its last")
    verdict = classes.classify(result)
    assert verdict.failure_class is FailureClass.PROGRAM
    assert "exited with code 0 before its last step" in verdict.why


def test_ctrl_c_stops_every_worker_and_exits_130(tmp_path):
    run = Run(tmp_path, interrupts=[2.0])
    workers = [run.worker(lines=[(0.5, progress(5))]) for _ in range(3)]
    result = run.supervise()
    assert result.interrupted and result.exit_code == 130 and result.first_failure is None
    assert run.states() == [State.STOPPED] * 3
    assert all(len(w.called("terminate")) == 1 and not w.called("kill") for w in workers)
    assert run.said[0] == "interrupted (SIGINT); stopping all processes"
    assert summary(result).startswith("INTERRUPTED: every process was stopped.")


def test_sigterm_to_the_launcher_is_an_interrupt_and_its_handler_is_restored(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    run = Run(tmp_path, interrupts=[1.0], on_interrupt=lambda: signal.raise_signal(signal.SIGTERM))
    run.worker()
    result = run.supervise()
    assert result.exit_code == 130 and run.said[0] == "interrupted (SIGTERM); stopping all processes"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_interrupt_during_teardown_kills_at_once(tmp_path):
    run = Run(tmp_path, interrupts=[1.0, 1.5])
    w = run.worker(on_term="ignore")
    result = run.supervise(grace_s=30)
    [term], [kill] = w.called("terminate"), w.called("kill")
    assert 0.4 < kill - term < 0.6  # not 30 s: the second Ctrl-C cut the grace period
    assert result.exit_code == 130 and run.states() == [State.STOPPED]
    assert "second interrupt: killing all processes now" in run.said


# ---- restarts.run with a fake session ---------------------------------------------------
def _job(backoff_s: float = 1.5, **budgets):
    return FakeTrainerJob(
        name="fake", num_processes=2,
        train=types.SimpleNamespace(compilation_cache=True),
        restarts=specs.RestartSpec(backoff_s=backoff_s, **budgets),
        watchdog=types.SimpleNamespace(stall_timeout_s=None, first_step_timeout_s=None),
        cluster=types.SimpleNamespace(grace_s=1.0),
        checkpoint=types.SimpleNamespace(notice_grace_s=25.0))


class Restarts:
    """``restarts.run`` over a FakeSession; supervise gets the fake clock, the backoff a recorder.

    Args:
      attempts: per attempt, how each worker ends by itself 1 s after its start
        (an Exit, or None: it runs until stopped).
    """

    def __init__(self, tmp_path, monkeypatch, job, *attempts):
        self.clock = FakeClock()
        self.waits: list = []
        self.out = io.StringIO()
        self.console = Console(self.out, tty=False, status_every_s=0)
        self.session = FakeSession(job, str(tmp_path), [functools.partial(self._start, ends)
                                                        for ends in attempts], self.console)
        monkeypatch.setattr(restarts, "supervise", functools.partial(
            supervision.supervise, clock=self.clock, sleep=self.clock.sleep))

    def _start(self, ends, plan) -> list:
        t0 = self.clock.now
        # a worker that succeeds says "done" before it exits, as the real one does
        return [FakeWorker(self.clock, p, lines=[(t0 + 0.5, progress(5))]
                           + ([(t0 + 0.9, "done")] if e is not None and e.ok else []),
                           exit=e, exit_at=None if e is None else t0 + 1.0)
                for p, e in zip(plan.processes, ends)]

    def run(self, interrupt_backoff: bool = False):
        def backoff(seconds):
            self.waits.append(seconds)
            self.clock.sleep(seconds)
            if interrupt_backoff:
                raise KeyboardInterrupt
        self.result, self.attempts = restarts.run(self.session, self.session.plan(), self.console,
                                                  restarts.Begin(sleep=backoff))
        return self.result, self.attempts

    def events(self) -> list:
        return [e[0] if e[0] != "plan" else f"plan(restart={e[1]})" for e in self.session.events]


def test_a_signal_death_is_retried_from_a_fresh_plan_after_end_attempt(tmp_path, monkeypatch):
    r = Restarts(tmp_path, monkeypatch, _job(max_restarts=1), (KILLED, None), (OK, OK))
    result, attempts = r.run()
    assert result.exit_code == 0
    assert r.events() == ["plan(restart=False)", "start", "end_attempt", "plan(restart=True)", "start"]
    assert r.waits == [0.0]  # the first infrastructure fault restarts at once
    assert [a.number for a in attempts] == [0, 1]
    assert attempts[0].verdict.startswith("failed: process_id 0 on localhost was killed by SIGKILL")
    assert attempts[0].failure.failure_class is FailureClass.INFRASTRUCTURE
    assert attempts[0].verdict.endswith("[infrastructure]; retried after 0 s")
    assert attempts[1].verdict == "succeeded"
    first_plan, second_plan = (e[1] for e in r.session.events if e[0] == "start")
    assert first_plan.processes[0].env[contract.RESUME] == "0"
    assert second_plan.processes[0].env[contract.RESUME] == "1"  # the restart restores the checkpoint
    assert second_plan.processes[1].log_path == os.path.join(str(tmp_path), "logs", "attempt-1",
                                                             "process-001.log")
    assert os.path.isfile(second_plan.processes[1].log_path)
    assert ("attempt 1 (infrastructure restart 1 of 10; restart 1 of 1 in all): starting 2 fake "
            "processes") in r.out.getvalue()


def test_by_default_a_sigkill_is_retried_and_a_python_error_is_not(tmp_path, monkeypatch):
    r = Restarts(tmp_path, monkeypatch, _job(), (KILLED, None), (OK, OK))
    result, attempts = r.run()
    assert result.exit_code == 0 and len(attempts) == 2 and r.waits == [0.0]
    assert "attempt 1 (infrastructure restart 1 of 10): starting" in r.out.getvalue()
    r = Restarts(tmp_path, monkeypatch, _job(), (Exited(1), None))
    result, attempts = r.run()
    assert result.exit_code == 1 and len(attempts) == 1 and r.waits == []
    assert r.events() == ["plan(restart=False)", "start"]
    assert attempts[0].failure.failure_class is FailureClass.PROGRAM
    assert attempts[0].verdict.endswith("a Python error in the job [program error]; not retried: "
                                        "a restart repeats it (restarts.program_errors is 0)"), \
        attempts[0].verdict


def test_max_restarts_bounds_the_attempts_and_the_backoff_doubles(tmp_path, monkeypatch):
    r = Restarts(tmp_path, monkeypatch, _job(max_restarts=2, backoff_s=1.5), *[(KILLED, OK)] * 3)
    result, attempts = r.run()
    assert result.exit_code == 1 and [a.number for a in attempts] == [0, 1, 2]
    assert r.waits == [0.0, 1.5]  # at once, then the backoff as the class repeats
    assert r.events() == ["plan(restart=False)", "start", "end_attempt", "plan(restart=True)", "start",
                          "end_attempt", "plan(restart=True)", "start"]
    assert attempts[-1].verdict.endswith("; not retrying: restarts.max_restarts is 2 and 2 used")
    assert "not retrying: restarts.max_restarts is 2 and 2 used" in r.out.getvalue()
    assert "attempts: 3 (2 restarts)" in restarts.attempts_table(attempts)


def test_an_exit_code_listed_for_retry_is_retried(tmp_path, monkeypatch):
    r = Restarts(tmp_path, monkeypatch, _job(max_restarts=1, retry_exit_codes=(1,)),
                 (Exited(1), None), (OK, OK))
    result, attempts = r.run()
    assert result.exit_code == 0 and len(attempts) == 2
    assert "exited with code 1 (in restarts.retry_exit_codes)" in attempts[0].verdict


def test_ctrl_c_during_the_backoff_ends_the_run_as_interrupted(tmp_path, monkeypatch):
    r = Restarts(tmp_path, monkeypatch, _job(program_errors=2), (Exited(1), None), (OK, OK))
    result, attempts = r.run(interrupt_backoff=True)
    assert result.exit_code == 130 and len(attempts) == 1
    assert attempts[0].verdict.endswith("retried after 1.5 s; interrupted while waiting")
    assert r.events() == ["plan(restart=False)", "start", "end_attempt"]  # no second plan or start


def test_with_many_processes_an_ended_one_is_seen_at_once_and_the_rest_are_walked_less_often(tmp_path):
    """issue 29: with 1,024 processes, walking every one at every poll (exits, stalls) was most
    of the loop's CPU. Above ``SWEEP_PROCESSES`` the walk comes less often, but a process
    whose output ended is polled at the next poll: every other process is told to stop at
    the same moment as in a run of two."""
    def run_of(count: int, path) -> tuple:
        run = Run(path)
        for i in range(count):
            ends = dict(exit=Exited(1), exit_at=1.02) if i == count - 1 else {}
            run.worker(lines=[(0.2, progress(1))], **ends)
        first, polled = run.workers[0], []
        first.poll = lambda poll=first.poll: (polled.append(run.clock.now), poll())[1]
        result = run.supervise(grace_s=1.0)
        assert result.first_failure.plan.process_id == count - 1
        told = [at for w in run.workers for what, at in w.calls if what == "terminate"]
        assert len(told) == count - 1
        return max(told), sum(at < 1.02 for at in polled)  # the polls while all ran

    many = 2 * supervision.SWEEP_PROCESSES  # a walk every 2 polls
    (tmp_path / "two").mkdir()
    told_two, polls_two = run_of(2, tmp_path / "two")
    told_many, polls_many = run_of(many, tmp_path)
    assert told_many == pytest.approx(told_two), (told_many, told_two)
    assert polls_many <= polls_two / 2 + 2, (polls_many, polls_two)


WARNING = "W1206 02:00:00.000000 1 pjrt.cc:9] slow collective; retrying"


@pytest.mark.parametrize("stepped", [False, True])
def test_a_worker_that_prints_warnings_but_never_steps_is_stalled(tmp_path, stepped):
    """Issue 51.9: only a step line or a heartbeat is progress. A worker that prints a
    warning every 0.2 s and never steps (again) is stalled at its limit; a watchdog that
    took any line for progress never would be."""
    run = Run(tmp_path)
    lines = [(0.1 + 0.2 * i, WARNING) for i in range(100)]  # to 20 s: past every limit below
    if stepped:
        lines = [(0.05, progress(1))] + lines
    w = run.worker(lines=lines, on_term="exit", term_exit=Killed(signal.SIGKILL))
    result = run.supervise(watchdog=Watchdog(stall_timeout_s=2.0, first_step_timeout_s=3.0))
    first = result.first_failure
    assert first is result.processes[0] and isinstance(first.exit, Stalled), result.processes
    # killed once past its limit (and the stacks' read), long before its warnings end at 20 s
    [kill] = w.called("kill")
    assert (2.05 if stepped else 3.0) <= kill < 12.0, kill


def test_the_cause_of_a_cascade_of_three_leads_though_two_consequences_came_first(tmp_path):
    """Issue 51.9: two peers report losing it (gloo's reset, the coordination abort) before
    the SIGKILLed process's end is seen; the summary leads with the SIGKILL, not a victim."""
    run = Run(tmp_path)
    gloo = "jax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: Connection closed by peer"
    abort = ("F1201 18:32:21.922875 client.h:80] Terminating process because the JAX "
             "distributed service detected fatal errors.")
    run.worker(lines=[(0.95, gloo)], exit=Exited(1), exit_at=1.0)
    run.worker(lines=[(1.0, abort)], exit=Killed(signal.SIGABRT), exit_at=1.05)
    run.worker(exit=Killed(signal.SIGKILL), exit_at=1.8)           # the cause, seen late
    result = run.supervise()
    assert result.first_failure is result.processes[2]
    assert summary(result).startswith("FAILED: process_id 2 on localhost (killed by SIGKILL)")
    assert classes.classify(result).failure_class is FailureClass.INFRASTRUCTURE
