"""Time the launcher itself did not run: Ctrl-Z and ``fg``, SIGSTOP and SIGCONT, a paused VM.

The stall watchdog asks how long a worker went without progress. While the launcher
is stopped its reader threads read nothing, so on ``fg`` every worker looks silent for
as long as the launcher was away, and a healthy run was SIGKILLed as stalled (issue 25:
4 of 8 runs after a 12 s Ctrl-Z). ``Pauses`` finds those spans with a thread that wakes
every ``tick_s``: a wake-up much later than asked means the whole process was not
scheduled. The watchdog leaves the spans out of every age (``within``). A slow
supervision loop is not a pause: the ticker keeps its own time.

Stdlib only.
"""

from __future__ import annotations

import threading
import time
from typing import Callable


class Pauses:
    """Spans of ``clock`` time during which this process did not run.

    Args:
      clock: monotonic seconds (the supervision loop's clock).
      tick_s: how often the ticker thread wakes.
      threshold_s: a wake-up this much later than the previous one is a pause.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, tick_s: float = 0.25,
                 threshold_s: float = 1.5):
        self.clock, self.tick_s, self.threshold_s = clock, tick_s, threshold_s
        self._lock = threading.Lock()
        self._last = clock()
        self._spans: list = []
        self._told = 0  # spans ``news`` has handed out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pauses", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.observe()

    def observe(self) -> None:
        """Take a reading now (the ticker does, and the watchdog before it judges, so a
        pause that just ended counts even if the ticker has not woken since)."""
        with self._lock:
            now = self.clock()
            gap = now - self._last
            self._last = now
            if gap > self.threshold_s:
                self._spans.append((now - gap, now))

    def news(self) -> float:
        """Seconds of the pauses found since the last call (to say so once); 0 when none."""
        with self._lock:
            new, self._told = self._spans[self._told:], len(self._spans)
            return sum(b - a for a, b in new)

    def within(self, start: float, end: float) -> float:
        """Seconds of pause between ``start`` and ``end`` (clock times)."""
        with self._lock:
            return sum(max(0.0, min(end, b) - max(start, a)) for a, b in self._spans)

    def close(self) -> None:
        self._stop.set()
