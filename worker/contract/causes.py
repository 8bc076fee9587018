"""The worker's own explanation of why it ends: one line the launcher reads its class from.

An exit code alone is ambiguous: a program's own ``sys.exit(3)`` is not the worker's
``EXIT_MISMATCH``, and an ``OSError`` exits 1 like any Python error. So where the worker
knows the cause (its identity or devices disagree with the plan, bad data, a full disk),
its last line says it, ``worker: TEXT [CAUSE]``, and ``launcher.run.classes`` takes the
class and the advice from that line (the text is the advice: what to do about it).
A line without the bracketed cause is a line like any other.
"""

from __future__ import annotations

import errno
import re
import resource  # here, not when a limit ran out: importing it then needs a file too

MISMATCH = "mismatch"    # the identity or JAX's devices disagree with the plan: configuration
DATA = "data"            # bad rows (file, row, column): the same on every restart
DISK_FULL = "disk-full"  # no space (or quota) writing the run directory: free it, then --resume
UNREACHABLE = "unreachable"  # the coordinator's address unreachable from the host: its network
EXHAUSTED = "exhausted"  # a limit of the host ran out (open files, processes, ports): raise it
CAUSES = (MISMATCH, DATA, DISK_FULL, UNREACHABLE, EXHAUSTED)

_LINE_RE = re.compile(r"^worker: (?P<text>.*) \[(?P<cause>%s)\]$"
                      % "|".join(re.escape(c) for c in CAUSES))


def line(cause: str, text: str) -> str:
    """The line that explains the worker's end (``cause``: one of ``CAUSES``)."""
    if cause not in CAUSES:
        raise ValueError(f"cause {cause!r}: expected one of {', '.join(CAUSES)}")
    return f"worker: {text} [{cause}]"


def said(tail) -> tuple | None:
    """``(cause, text)`` of the last explaining line in ``tail`` (a process's last lines),
    or None when the worker explained nothing."""
    for text in reversed(list(tail)):
        match = _LINE_RE.match(text)
        if match:
            return match.group("cause"), match.group("text")
    return None


def exhausted(exc: OSError) -> str | None:
    """What an exhausted limit of the host means to the user, with the limit's value, or None
    for any other OSError: open files (EMFILE: this process's ``ulimit -n``; ENFILE: the
    system's table), processes or threads (EAGAIN from fork or a thread's start, ``ulimit -u``),
    local ports (EADDRNOTAVAIL)."""
    def limit(which) -> str:
        soft, hard = resource.getrlimit(which)
        shown = ["unlimited" if v == resource.RLIM_INFINITY else str(v) for v in (soft, hard)]
        return f"{shown[0]} (hard limit {shown[1]})"

    if exc.errno == errno.EMFILE:
        return (f"too many open files: this process's limit is {limit(resource.RLIMIT_NOFILE)} "
                "(ulimit -n); raise it in the shell that launches (ulimit -n 65536) or in "
                "cluster.setup, then launch again")
    if exc.errno == errno.ENFILE:
        return ("too many open files on this host (the system's file table is full: "
                "/proc/sys/fs/file-max); close what holds them, then launch again")
    if exc.errno == errno.EAGAIN and ("fork" in str(exc) or "thread" in str(exc).lower()):
        return (f"no more processes or threads: this user's limit is "
                f"{limit(resource.RLIMIT_NPROC)} (ulimit -u); raise it, then launch again")
    if exc.errno == errno.EADDRNOTAVAIL:
        return ("no local address or port left to connect from (EADDRNOTAVAIL: the ephemeral "
                "ports of /proc/sys/net/ipv4/ip_local_port_range are in use); wait for them "
                "to free, or widen the range, then launch again")
    return None


def disk_full(exc: OSError, run_dir: str | None = None) -> str | None:
    """What a full disk (or quota) means to the user, or None for any other OSError."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    where = exc.filename or (f"into {run_dir}" if run_dir else "the run directory")
    return (f"the disk is full ({exc.strerror}) writing {where}: free space there (df shows "
            "it), or lower checkpoint.keep, then continue with launch --resume RUN_DIR")
