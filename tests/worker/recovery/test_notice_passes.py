"""The loop's quiet calls tell the notice of each dispatch without its lock (``Notice.passes``):
the step a process reports to the agreement is never below one it dispatched, so no process
stops before a step another has dispatched (its collectives would wait forever)."""

from __future__ import annotations

import threading
import time

from worker.recovery.notice import REPORT_DIR, Notice


class _Client:
    """The coordination service's client as the notice uses it, in memory: the notice key is
    set by the test, every process's report is kept."""

    def __init__(self):
        self.noticed, self.values = threading.Event(), {}

    def blocking_key_value_get(self, key, timeout_ms):
        self.noticed.wait()
        return "1"  # process 1's notice

    def key_value_set(self, key, value):
        self.values[key] = value

    def wait_at_barrier(self, name, timeout_ms):
        pass

    def key_value_dir_get(self, prefix):
        return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]


def test_the_reported_step_is_never_below_a_step_the_quiet_calls_dispatched():
    for _ in range(50):
        client = _Client()
        notice = Notice(0, 2, grace_s=30.0, client=client)
        notice.start()
        passed = [0]

        def loop():
            step = 1
            while notice.passes(step):  # a quiet call dispatched after each True
                passed[0] = step
                step += 1

        looping = threading.Thread(target=loop)
        looping.start()
        time.sleep(0.002)
        client.noticed.set()
        looping.join(timeout=10)
        assert not looping.is_alive()
        assert notice.may_dispatch(passed[0] + 1) in (True, False)  # the agreement ended
        reported = int(client.values[f"{REPORT_DIR}0"])
        assert reported >= passed[0], (reported, passed[0])
        assert notice.stop_step >= passed[0]
        notice.close()


def test_one_process_stops_after_the_last_step_it_was_told_of():
    notice = Notice(0, 1, grace_s=30.0)
    notice.start()
    for step in range(1, 8):
        assert notice.passes(step)
    notice.signalled(15)
    deadline = time.monotonic() + 10
    while not notice.held and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not notice.passes(8)  # held: the loop asks may_dispatch
    assert notice.stop_step == 7  # the last step it was told of before the notice
    assert not notice.may_dispatch(8)
    notice.close()
