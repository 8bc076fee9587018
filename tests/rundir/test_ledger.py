"""The goodput ledger without processes: scripted workers in fake time through the real
``restarts.run`` and ``supervise``, then ``launcher.rundir.ledger`` on what they recorded.

Every bucket is checked against the script's own times (when each line arrived, what
the workers said their saves and restores took), and the buckets against the wall time
of each attempt: a ledger that drops or double-counts a stretch fails here.
"""

from __future__ import annotations

import functools
import io
import json
import signal
import types

import pytest

from harness.fakes import FakeClock, FakeSession, FakeTrainerJob, FakeWorker
from launcher import spec as specs
from launcher.console import Console
from launcher.run import restarts
from launcher.rundir.watcher import Watchers
from launcher.rundir import ledger
from launcher.run import supervise as supervision
from launcher.ends import Exited, Killed
from worker.contract import wire

STEP_TIME_S = 0.1  # every progress line's step_time_s
# a line is read at the first poll (supervise's 0.05 s in fake time) at or after its time
POLL = dict(abs=0.051)


def progress(step: int, num_steps: int = 30) -> str:
    return wire.PROGRESS_FORMAT.format(step=step, num_steps=num_steps, loss=0.5,
                                           steps_per_s=1 / STEP_TIME_S, step_time_s=STEP_TIME_S,
                                           own_step_time_s=0.01)


def joined(process_id: int) -> str:
    return f"process {process_id}/2 joined 127.0.0.1:1"


CACHE = wire.CACHE_FORMAT.format(hits=0, misses=3, seconds="0.4", path="/cache")


def saved(step: int, seconds: float) -> str:
    return wire.CHECKPOINT_FORMAT.format(step=step, seconds=seconds,
                                             path=f"/r/checkpoints/step-{step:07d}")


def resumed(step: int, seconds: float) -> str:
    return wire.RESUMED_FORMAT.format(step=step, attempt=1, seconds=seconds)


def _job(**budgets):
    return FakeTrainerJob(
        name="fake", num_processes=2,
        train=types.SimpleNamespace(compilation_cache=True),
        restarts=specs.RestartSpec(backoff_s=1.0, **budgets),
        watchdog=types.SimpleNamespace(stall_timeout_s=None, first_step_timeout_s=None),
        cluster=types.SimpleNamespace(grace_s=1.0),
        checkpoint=types.SimpleNamespace(notice_grace_s=25.0))


class Ledgered:
    """``restarts.run`` over scripted attempts in fake time, the launch beginning at 0."""

    def __init__(self, tmp_path, monkeypatch, job, *attempts, launch_s: float = 0.25):
        self.clock = FakeClock()
        self.out = io.StringIO()
        self.console = Console(self.out, tty=False, status_every_s=0)
        self.session = FakeSession(job, str(tmp_path), [functools.partial(self._start, a)
                                                        for a in attempts], self.console)
        self.launch_s = launch_s
        monkeypatch.setattr(restarts, "supervise", functools.partial(
            supervision.supervise, clock=self.clock, sleep=self.clock.sleep))

    def _start(self, scripts, plan) -> list:
        self.clock.sleep(self.launch_s)  # what starting the processes takes
        t0 = self.clock.now
        return [FakeWorker(self.clock, p, lines=[(t0 + at, text) for at, text in s["lines"]],
                           exit=s.get("exit"), exit_at=None if "exit" not in s else t0 + s["exit_at"])
                for p, s in zip(plan.processes, scripts)]

    def run(self, running: ledger.Running | None = None):
        plan = self.session.plan()
        self.result, self.attempts = restarts.run(
            self.session, plan, self.console,
            restarts.Begin(sleep=self.clock.sleep, began_at=0.0, clock=self.clock),
            Watchers([running]))
        self.entries = ledger.add_attempts([], self.attempts)
        return self.entries


def _adds_up(entries, attempts):
    """Each attempt's buckets are its wall time, from its start to the next one's."""
    for entry, attempt in zip(entries, attempts):
        times = attempt.times
        wall = times.ended_at - times.began_at + times.waited_s
        assert sum(entry["buckets_s"].values()) == pytest.approx(wall, abs=0.01), entry
        assert entry["wall_s"] == pytest.approx(wall, abs=0.01)
        assert set(entry["buckets_s"]) == set(ledger.BUCKETS)
        assert all(v >= 0 for v in entry["buckets_s"].values()), entry
    for before, after in zip(attempts, attempts[1:]):  # nothing between two attempts is lost
        assert after.times.began_at == pytest.approx(before.times.ended_at + before.times.waited_s, **POLL)


def test_a_clean_run_splits_into_launch_join_compilation_steps_saves_and_shutdown(tmp_path,
                                                                                 monkeypatch):
    clean = [{"lines": [(0.5, joined(0)), (1.5, CACHE), (2.5, progress(10)), (2.6, saved(10, 0.2)),
                        (3.5, progress(30)), (3.7, saved(30, 0.3)), (3.8, "done")],
              "exit": Exited(0), "exit_at": 4.0},
             {"lines": [(0.7, joined(1)), (1.4, CACHE), (2.5, progress(10)), (3.5, progress(30)),
                        (3.8, "done")], "exit": Exited(0), "exit_at": 4.0}]
    r = Ledgered(tmp_path, monkeypatch, _job(), clean)
    (entry,) = r.run()
    _adds_up(r.entries, r.attempts)
    b = entry["buckets_s"]
    assert b["launch"] == pytest.approx(0.25, **POLL)            # FakeSession.start's time
    assert b["start_and_join"] == pytest.approx(0.7, **POLL)     # to the last process's joined line
    assert b["compilation"] == pytest.approx(0.4, **POLL)        # the CACHE line's own seconds
    assert b["setup"] == pytest.approx(0.8 - 0.4, **POLL)        # the rest to the last first step
    assert b["productive"] == pytest.approx(2.0 - 0.2, **POLL)   # first step to last progress, less the save
    assert b["checkpoint"] == pytest.approx(0.2 + 0.3, **POLL)   # process 0's own seconds
    assert b["shutdown"] == pytest.approx(r.attempts[0].times.ended_at - 0.25 - 3.5 - 0.3, **POLL)
    assert b["retrained"] == b["teardown"] == b["restore"] == b["restart_wait"] == 0
    assert entry["resumed_step"] == 0 and entry["reached_step"] == 30 and entry["steps_again"] == 0
    run = ledger.totals(r.entries)
    assert run["goodput"] == pytest.approx(b["productive"] / entry["wall_s"], abs=1e-3)
    # issue 50, item 3: the words say what goodput means, that a start-up cost is paid once,
    # and where the words are explained
    assert ledger.summary_line(run) == (
        f"goodput {run['goodput']:.2f}: {b['productive']:.1f} s of the run's {entry['wall_s']:.1f} s "
        "went into training steps that count; largest loss of time (badput): process start and "
        f"join {b['start_and_join']:.1f} s, paid once however long the run (docs/glossary.md)")


# two attempts: process 1 killed at 4.0 after step 20 (process 0 runs until stopped), then a
# restart resumed from step 10 that runs to step 30
CRASHED = [{"lines": [(0.5, joined(0)), (1.5, CACHE), (2.5, progress(10)), (2.6, saved(10, 0.2)),
                      (3.5, progress(20))]},
           {"lines": [(0.5, joined(1)), (1.5, CACHE), (2.5, progress(10)), (3.5, progress(20))],
            "exit": Killed(signal.SIGKILL), "exit_at": 4.0}]
AGAIN = [{"lines": [(0.3, joined(0)), (0.5, resumed(10, 0.3)), (1.0, CACHE), (2.0, progress(20)),
                    (3.0, progress(30)), (3.1, "done")], "exit": Exited(0), "exit_at": 3.2},
         {"lines": [(0.3, joined(1)), (0.5, resumed(10, 0.1)), (1.0, CACHE), (2.0, progress(20)),
                    (3.0, progress(30)), (3.1, "done")], "exit": Exited(0), "exit_at": 3.2}]


def test_a_crash_and_restart_counts_teardown_wait_restore_and_the_steps_trained_again(
        tmp_path, monkeypatch):
    r = Ledgered(tmp_path, monkeypatch, _job(), CRASHED, AGAIN)
    first, second = r.run()
    _adds_up(r.entries, r.attempts)
    a, b = first["buckets_s"], second["buckets_s"]
    # attempt 0: the crash at 4.0 is detected, the rest torn down: from its last progress on
    assert a["productive"] == pytest.approx(2.0 - 0.2, **POLL) and a["checkpoint"] == pytest.approx(0.2, **POLL)
    assert a["teardown"] == pytest.approx(r.attempts[0].times.ended_at - 0.25 - 3.5, **POLL)
    assert a["restart_wait"] == pytest.approx(r.attempts[0].times.waited_s, **POLL) and a["shutdown"] == 0
    # attempt 1: resumed at step 10 after attempt 0 logged step 20: 10 steps trained again
    assert second["resumed_step"] == 10 and second["steps_again"] == 10
    assert b["restore"] == pytest.approx(0.3, **POLL)            # process 0's restore
    assert b["compilation"] == pytest.approx(0.4, **POLL)        # the CACHE line's seconds
    assert b["setup"] == pytest.approx(0.7 - 0.4 - 0.3, **POLL)  # joined 0.3, first step 1.0, less restore
    assert b["retrained"] == pytest.approx(10 * STEP_TIME_S, **POLL)
    assert b["productive"] == pytest.approx(2.0 - 10 * STEP_TIME_S, **POLL)
    run = ledger.totals(r.entries)
    assert run["steps_again"] == 10
    assert run["wall_s"] == pytest.approx(r.attempts[1].times.ended_at, abs=0.01)  # from 0 to the end
    assert "10 steps trained again" in ledger.summary_line(run)


def test_the_goodput_so_far_of_a_running_run_is_the_ledgers_at_each_moment(tmp_path, monkeypatch):
    """``ledger.Running``, what run.json's goodput says while a run goes on (``launch runs``):
    at each status refresh, productive seconds so far over the wall seconds since the launch,
    the attempt under way cut there, earlier attempts and earlier launches counted."""
    r = Ledgered(tmp_path, monkeypatch, _job(), CRASHED, AGAIN)
    earlier = [{"attempt": 0, "wall_s": 10.0, "reached_step": None, "steps_again": 0,
                "buckets_s": dict(dict.fromkeys(ledger.BUCKETS, 0.0), productive=4.0, launch=6.0)}]
    running = ledger.Running(earlier)  # a resumed run: an earlier launch's 4 s of 10 productive
    seen = []  # (now, goodput so far, the attempt under way)
    r.console.watchers.append(lambda tracked, _: seen.append(  # at each poll, on the fake clock
        (r.clock.now, running.goodput(tracked, r.clock.now), running.current and running.current[0])))
    r.run(running)
    t0 = 0.25  # attempt 0's processes start (FakeSession.start's time)
    # attempt 0, between its last progress line (read at 3.5) and the crash: 1.8 productive
    # seconds (2.5 - 1.5 of steps, 1.0 more, less the 0.2 s save) over the wall so far
    # (each line's time to a poll, 0.05 s)
    late = [(now, g) for now, g, attempt in seen if attempt == 0 and t0 + 3.56 <= now < t0 + 4.0]
    assert late and all(g == pytest.approx((4.0 + 1.8) / (10.0 + now), abs=0.06 / 14)
                        for now, g in late), late
    early = [(now, g) for now, g, attempt in seen if now < t0 + 1.5]  # before any step: none
    assert early and all(g == pytest.approx(4.0 / (10.0 + now), abs=1e-4) for now, g in early), early
    # the last figure of the run is the ledger's at the end, but for the last moments
    final = ledger.totals(earlier + r.entries)["goodput"]
    last_now, last, _ = [x for x in seen if x[2] == 1][-1]
    assert last == pytest.approx(final, abs=0.02) and last_now <= r.attempts[1].times.ended_at
    assert running.current is None and running.attempts == r.attempts


def test_a_crash_before_the_first_step_is_setup_then_teardown(tmp_path, monkeypatch):
    r = Ledgered(tmp_path, monkeypatch, _job(),
                 [{"lines": [(0.5, joined(0))]},
                  {"lines": [(0.5, joined(1)), (1.2, "Traceback: boom")], "exit": Exited(1),
                   "exit_at": 1.25}])
    (entry,) = r.run()
    _adds_up(r.entries, r.attempts)
    b = entry["buckets_s"]
    failure = r.result.first_failure
    assert b["setup"] == pytest.approx(failure.ended_at - 0.25 - 0.5, **POLL)  # joined to detection
    assert b["compilation"] == 0  # nothing measured it: no first step
    assert b["teardown"] == pytest.approx(r.attempts[0].times.ended_at - failure.ended_at, **POLL)
    assert b["productive"] == 0 and entry["reached_step"] is None


def test_a_host_late_to_join_is_join_time_not_compilation(tmp_path, monkeypatch):
    # issue 51.2: process 1 starts joining 12 s late at a restart; process 0 gives up after
    # initialization_timeout_s 10 (JAX's abort): its 10.6 s of waiting were filed as compilation
    joining = wire.JOINING_FORMAT.format(address="127.0.0.1:1", timeout_s=10)
    r = Ledgered(tmp_path, monkeypatch, _job(),
                 [{"lines": [(0.5, joining)], "exit": Killed(signal.SIGABRT), "exit_at": 10.6},
                  {"lines": []}])
    (entry,) = r.run()
    _adds_up(r.entries, r.attempts)
    b = entry["buckets_s"]
    assert b["start_and_join"] == pytest.approx(r.result.first_failure.ended_at - 0.25, **POLL)
    assert b["compilation"] == b["setup"] == 0, b


def test_compilation_is_the_first_steps_measured_seconds_not_the_data_before_it(tmp_path,
                                                                                monkeypatch):
    # issue 51.2: one process making a 65,536 x 256 table for 7.7 s, then its first step
    # (trace, compile, dispatch) in 1.5 s: compilation was 9.2 s
    one = [{"lines": [(0.2, "process 0/1: one process, in-process collectives (no jax.distributed)"),
                      (9.4, wire.CACHE_FORMAT.format(hits=0, misses=3, seconds="1.5",
                                                         path="/cache")),
                      (9.6, progress(30)), (9.7, "done")], "exit": Exited(0), "exit_at": 9.8}]
    r = Ledgered(tmp_path, monkeypatch, _job(), one)
    (entry,) = r.run()
    _adds_up(r.entries, r.attempts)
    b = entry["buckets_s"]
    assert b["compilation"] == pytest.approx(1.5, abs=1e-6)
    assert b["setup"] == pytest.approx(9.4 - 1.5, **POLL) and b["start_and_join"] == 0


def test_the_ledger_file_keeps_every_launch_and_counts_steps_again_across_them(tmp_path):
    first = {"attempt": 0, "buckets_s": dict.fromkeys(ledger.BUCKETS, 10.0 / len(ledger.BUCKETS)),
             "resumed_step": 0,
             "reached_step": 40, "steps_again": 0, "wall_s": 10.0}
    ledger.write(str(tmp_path), [first])
    earlier = ledger.read(str(tmp_path))
    assert earlier == [first]
    times = ledger.Times(began_at=0.0, started_at=1.0, ended_at=5.0)
    stats = types.SimpleNamespace(first_step_at=2.0, first_step_s=None, progress_at=4.0,
                                  saves=[], restores=[],
                                  resumed_at=30, mean_step_time_s=0.05,
                                  progress=types.SimpleNamespace(step=50))
    process = types.SimpleNamespace(joined_at=1.5, joining="h:1", joined=True, stats=stats,
                                    last_step=51, failed_at_step=False)
    result = types.SimpleNamespace(processes=[process], first_failure=None, exit_code=0)
    attempt = types.SimpleNamespace(number=1, times=times, result=result)
    entries = ledger.add_attempts(earlier, [attempt])
    assert entries[1]["steps_again"] == 10                # 30 -> 40, logged by the earlier launch
    assert entries[1]["buckets_s"]["retrained"] == pytest.approx(0.5, **POLL)
    run = ledger.write(str(tmp_path), entries)
    with open(tmp_path / ledger.LEDGER_FILE) as f:
        data = json.load(f)
    assert data["run"] == run and len(data["attempts"]) == 2
    assert run["wall_s"] == pytest.approx(10.0 + 5.0, **POLL) and run["steps_again"] == 10


def test_an_unreadable_ledger_file_is_an_empty_one(tmp_path):
    (tmp_path / ledger.LEDGER_FILE).write_text("{not json")
    assert ledger.read(str(tmp_path)) == []
    (tmp_path / ledger.LEDGER_FILE).write_text('{"attempts": [1, {"x": 2}]}')
    assert ledger.read(str(tmp_path)) == []
