"""How often a step line reaches a terminal: at a pace a person reads.

A long run logs a step every ``log_every_steps``: 20,000 steps at 10 are 2,000 lines, up to
30 a second on a fast job, each with nearly the same loss. On a terminal (the foreground
launch and ``launch attach``) a process's step line is shown when ``EVERY_S`` have passed
since its last one shown, and always its last step; the redrawn progress line below them
shows the latest step and loss all the time. That is at most 30 lines a minute: less than
a 40-line screen. The first line held back says so, once (``NOTICE``). Nothing else is held
back, and every step line still goes to ``launcher.log``, the process's log file,
``metrics.jsonl`` and TensorBoard; piped or in a file every line is written.
"""

from __future__ import annotations

import time

from worker.contract import wire

EVERY_S = 2.0  # seconds between a process's step lines on a terminal, at the least
NOTICE = (f"step lines on this terminal: one every {EVERY_S:g} s at most, and the last; the "
          "progress line below shows the latest step and loss; every logged step is in "
          "launcher.log (launch logs), metrics.jsonl and TensorBoard")


class StepPace:
    """Which step lines a terminal shows (``admit``), and the notice said once.

    Args:
      clock: seconds, monotonic.
      every_s: the least seconds between a process's step lines shown.
    """

    def __init__(self, clock=time.monotonic, every_s: float = EVERY_S):
        self.clock, self.every_s = clock, every_s
        self._shown_at: dict = {}  # process (its label or id) -> clock of its last line shown
        self._held = False
        self._said = False

    def admit(self, process, text: str) -> bool:
        """Whether the line ``text`` of ``process`` is shown: anything but a step line is; a
        step line when ``every_s`` passed since the process's last one shown, or when it is
        its last step."""
        if not text.startswith("step "):  # the parse below only for what may be a step line
            return True
        line = wire.parse(text)
        if not isinstance(line, wire.Progress) or line.finished:
            return True
        now = self.clock()
        last = self._shown_at.get(process)
        if last is not None and now - last < self.every_s:
            self._held = True
            return False
        self._shown_at[process] = now
        return True

    def notice(self) -> str | None:
        """``NOTICE`` the first time a line was held back, else None."""
        if self._held and not self._said:
            self._said = True
            return NOTICE
        return None
