"""What a worker says of a preemption notice: the launcher reads these lines (the run's
failure class, ``launcher.run.classes``; the console; supervision's wait for the agreed save).

The agreement itself, every process stopping after one step, is ``worker.recovery.notice``.
"""

from __future__ import annotations

import re

PREFIX = "preemption notice from process "
AGREED_FORMAT = PREFIX + "{source}: every process stops after step {step}{saving}"
AGREED_RE = re.compile(r"^preemption notice from process (?P<source>\d+): every process stops "
                       r"after step (?P<step>\d+)")
FAILED_FORMAT = (PREFIX + "{source}: {why}; no checkpoint saved now "
                 "(the next attempt resumes from the last one)")
