"""The time on every line of a run's log files.

Every line the launcher writes to a run directory's logs (``launcher.log``, and each
process's ``logs/[attempt-N/]process-NNN.log``) starts with the UTC time it was written, to
the millisecond, and a space: ``2026-12-06T07:30:01.123Z step 10/100 ...``. A log read after
the fact (a detached run's, a run that stopped moving) so says when each line came.

What shows or parses the lines takes the time off (``unstamped``, ``read_text``): ``launch
logs`` replays what the console showed (``--timestamps`` keeps the times), and a line read
back is the line the worker printed.
"""

from __future__ import annotations

import datetime
import re
import time

STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")
STAMP_CHARS = len("2026-12-06T07:30:01.123Z ")

_LINE_STAMP = re.compile("^" + STAMP.pattern, re.M)  # ^ after "\n" only, not "\r"
_last: tuple = (None, "")  # the millisecond (since the epoch) last stamped, and its stamp
_second: tuple = (None, "")  # the whole UTC second last stamped, its text up to the seconds


def stamp(now_s: float | None = None) -> str:
    """The prefix of a line written at ``now_s`` (seconds since the epoch; default: now).

    Made once a millisecond, its date and time up to the second once a second: this is called
    for every line a worker prints (bench/bench_lines.py measures the reader's cost per line;
    lines that come in a burst share their millisecond).
    """
    global _last, _second
    ms_since_epoch = int((time.time() if now_s is None else now_s) * 1000)
    last = _last  # tuples, replaced whole: a reader thread per process calls this
    if last[0] == ms_since_epoch:
        return last[1]
    second, ms = divmod(ms_since_epoch, 1000)
    cached = _second
    if cached[0] != second:
        cached = _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    text = f"{cached[1]}.{ms:03d}Z "
    _last = (ms_since_epoch, text)
    return text


def stamped(text: str, at_line_start: bool = True, now_s: float | None = None) -> str:
    """``text`` with each line that starts in it led by the time (``stamp``).

    Lines end at ``\\n`` only (a worker's ``\\r`` stays inside its line). ``at_line_start``:
    whether ``text`` begins a line (False: it continues one written before, which has its time).
    """
    prefix = stamp(now_s)
    if at_line_start and text.endswith("\n") and text.count("\n") == 1:  # one line: the usual
        return prefix + text
    parts = text.split("\n")
    out = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if last and not part:  # text ended with its newline
            break
        if at_line_start or i:
            out.append(prefix)
        out.append(part if last else part + "\n")
    return "".join(out)


def unstamped(text: str) -> str:
    """``text`` (lines of a log file) with each line's time taken off; a line without one
    (a log written before lines had times) is left as it is."""
    return _LINE_STAMP.sub("", text)


def time_of(line: str) -> datetime.datetime | None:
    """When a log line was written (UTC, aware), or None for a line without a time."""
    if not STAMP.match(line):
        return None
    return datetime.datetime.strptime(line[:STAMP_CHARS - 2], "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=datetime.timezone.utc)


def read_text(path) -> str:
    """A log file's text without its times: the lines as the worker or the launcher said them
    (a ``\r`` inside a line kept as written)."""
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        return unstamped(f.read())
