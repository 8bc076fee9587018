"""The signals between the launcher and a worker, as both read them: the exit code of a
worker ended by a signal, and the request for every thread's stack with the format of its
answer. How a worker handles them is ``worker.runtime.interrupts``.
"""

from __future__ import annotations

import re
import signal


def exit_code(signum: int) -> int:
    """The exit code of a worker ended by signal ``signum`` in order: ``128 + signum``."""
    return 128 + signum


# The launcher's request for every thread's stack (launcher.run.stacks), sent to the worker
# process alone. SIGUSR2: SIGUSR1 is what Slurm users ask for a time limit's warning.
STACKS_SIGNAL = signal.SIGUSR2
# What faulthandler writes (CPython's Python/traceback.c): a header per thread, its frames
# innermost first, a blank line between threads.
STACKS_HEADER_RE = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):$")
STACKS_FRAME_RE = re.compile(r'^  File "(?P<path>.*)", line (?P<line>\d+) in (?P<name>.*)$')
_STACKS_HEADS = ("Thread 0x", "Current thread 0x")
_STACKS_OTHER_RE = re.compile(r"^  (?:<no Python frame>|\.\.\.)$")  # no frame; cut at 100


def is_stacks_line(line: str, within: bool) -> bool:
    """Whether ``line`` is part of an ``answer_stack_requests`` dump: a thread's header, or,
    ``within`` a dump, a frame, a blank line between threads, or its other lines."""
    if line.startswith(_STACKS_HEADS):  # a prefix test first: every worker line passes here
        return STACKS_HEADER_RE.match(line) is not None
    return within and (line == "" or line.startswith("  ") and (
        STACKS_FRAME_RE.match(line) is not None or _STACKS_OTHER_RE.match(line) is not None))
