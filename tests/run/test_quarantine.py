"""Quarantine of a slow host (``restarts.quarantine_slower_than``), process-free: the
per-process step times a failed attempt's processes reported decide, over the host's own
time per step (outside JAX), never the whole step time every process shares."""

from __future__ import annotations

import collections

from launcher.backends.ssh.session import SLOW_MARGIN_S, slow_hosts
from launcher.state import Exited, Result, State, Tracked
from launcher.stats import ProcessStats


def process(process_id: int, own_ms: float, step_ms: float = 120.0) -> Tracked:
    plan = type("P", (), {"process_id": process_id, "host": f"h{process_id}",
                          "label": f"p{process_id}", "log_path": "/x"})()
    t = Tracked(worker=type("W", (), {"plan": plan})(), state=State.STOPPED, exit=Exited(1))
    t.tail = collections.deque()
    t.stats = ProcessStats()
    for step in (10, 20):  # two log intervals of 10 steps, as the worker prints them
        t.stats.observe(f"step {step}/40 loss 0.5 | 8.0 steps/s | step_time_s {step_ms / 1e3:g} "
                        f"(own {own_ms / 1e3:g})")
    return t


def result(*own_ms: float) -> Result:
    processes = [process(i, ms) for i, ms in enumerate(own_ms)]
    return Result(processes, processes[0], False, 1.0)


def test_the_host_whose_own_time_per_step_is_far_over_the_median_is_named():
    # four hosts of one process; the third spends 100 ms of each step in its own code
    found = slow_hosts(result(0.5, 0.7, 100.0, 0.3), [range(0, 1), range(1, 2), range(2, 3),
                                                      range(3, 4)], 3.0)
    assert [i for i, _ in found] == [2]
    assert ("own time per step was 100.0 ms, 166.7 times the median process's 0.6 ms "
            "(restarts.quarantine_slower_than 3)") in found[0][1], found


def test_a_host_is_judged_by_its_slowest_process_and_small_gaps_are_noise():
    # two hosts of two processes: host 1's second process is slow
    ids = [range(0, 2), range(2, 4)]
    assert [i for i, _ in slow_hosts(result(1.0, 1.2, 1.1, 40.0), ids, 2.0)] == [1]
    # ten times the median, yet under SLOW_MARGIN_S more: no verdict on a few milliseconds
    small = SLOW_MARGIN_S * 1e3 / 2
    assert slow_hosts(result(0.1, 0.1, 0.1, small), [range(i, i + 1) for i in range(4)], 2.0) == []
    # nothing known (no progress line) or a single process: nothing to compare with
    assert slow_hosts(result(5.0), [range(0, 1)], 2.0) == []
