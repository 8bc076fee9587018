"""Worker output on its way from the reader threads to the log files and the console.

One reader thread per process (``pump``) writes each line to the process's log file first
(nothing is lost), feeds it to the process's ``Tracked`` (progress, heartbeats, the
watchdog's clock) and queues it for the console; supervision's loop shows the queued lines
once per poll (``Output.wait``).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable

from launcher.console import Console, lines
from launcher.run import logfile
from launcher.state import Tracked


class Output:
    """Worker lines on their way to the console; waiting on it is how supervision lets time pass.

    Args:
      console: where the lines go.
      sleep: called with the seconds to let pass, after which the lines that arrived
        are shown; None: ``time.sleep`` (tests pass one that advances a fake clock).
    """

    def __init__(self, console: Console, sleep: Callable[[float], None] | None = None):
        # a deque, not a queue.Queue: appending and popping are atomic and nobody blocks on
        # it, so each line costs no Condition's lock and notify (bench/bench_lines.py)
        self._lines: collections.deque = collections.deque()
        self.console = console
        self.sleep = sleep
        self._ended: list = []  # processes whose output ended, until they are seen to end
        self._ended_lock = threading.Lock()

    def output_ended(self, tracked: Tracked) -> None:
        """A reader's stream ended (its process is ending): polled at every poll from now."""
        with self._ended_lock:
            self._ended.append(tracked)

    def ended(self) -> list:
        """The processes whose output ended and that were running at the last look."""
        with self._ended_lock:
            self._ended = [t for t in self._ended if t.running]
            return list(self._ended)

    def put(self, item: tuple) -> None:
        # (label, text) or (label, text, process_id): the id lets --show filter
        self._lines.append(item)

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass, then show every line that has arrived.

        The lines wait for the end of the poll (50 ms) rather than wake the loop one by
        one: a line's hand-off between threads costs more than its handling, and with
        1,024 processes that was most of supervision's CPU (bench/bench_supervise_scale.py).
        """
        if seconds:
            (self.sleep or time.sleep)(seconds)
        while self._lines:  # one reader of it (supervision's loop): never empty on the pop
            self.console.line(*self._lines.popleft())


def pump(tracked: Tracked, out: Output, clock: Callable[[], float], logs: list) -> None:
    """Reader thread: log file first, then the console queue.

    A long line (one that arrives in ``lines.Piece``s, or is longer than
    ``lines.MAX_SHOWN_CHARS``) goes to the log file whole, as it arrives, and
    to the console and the summary shortened.
    """
    with logfile.LogFile(tracked.plan.log_path, lambda text: out.put((tracked.plan.label, text))) as log:
        logs.append(log)
        long = lines.Shortened()
        try:
            for item in tracked.worker.lines():
                if isinstance(item, lines.Piece):  # more of this line follows
                    log.write(item, flush=False)
                    long.add(item)
                    continue
                if long.pending or len(item) > long.max_chars:
                    log.write(item + "\n")
                    shown = long.end(item)
                    if tracked.observe(shown, clock()):
                        out.put((tracked.plan.label, shown, tracked.plan.process_id))
                    continue
                for line in lines.split_glued(item):  # threads' glued lines split back
                    if tracked.detail(line):  # an expected failure's traceback: the log only
                        log.write(line + "\n")
                        continue
                    if not tracked.observe(line, clock()):
                        continue  # a heartbeat: for the watchdog only
                    log.write(line + "\n")
                    out.put((tracked.plan.label, line, tracked.plan.process_id))
        except Exception as exc:  # a reader must never die silently
            out.put((tracked.plan.label, f"podlaunch: output stream broke: {exc!r}"))
        tracked.output_closed(clock())
        out.output_ended(tracked)
