"""What a library's words in a failed process's last lines usually mean, and what to do.

A failed worker's tail often ends in text written for the library's own developers:
gloo's ``Connection closed by peer [127.0.0.1]:8615`` in a ``JaxRuntimeError``, the
coordination service's ``UNAVAILABLE: Socket closed``, XLA's ``RESOURCE_EXHAUSTED``.
The summary keeps those lines as they were (they are in the log too) and adds, under
them, what was seen, what it usually means and what to do (``meaning``). The texts
matched are those jax 0.9 / jaxlib 0.9 print (seen in this project's runs: a peer killed
mid-all-reduce, a coordinator gone, a port in use).
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, NamedTuple

from worker.contract import wire


class Reading(NamedTuple):
    matches: Callable[[str], bool]
    meaning: str


def _words(pattern: str, flags: int = 0) -> Callable[[str], bool]:
    return re.compile(pattern, flags).search


# The readings of a process that stopped because another did (a cascade), first in READINGS
_CASCADE = 2

READINGS = (
    Reading(lambda line: wire.is_peer_loss(line) and "Gloo" in line,  # the cascade markers
            "a collective (gloo, JAX's CPU all-reduce) was cut off from another process: "
            "that process died or its host went away, so this failure follows from another; "
            "look at the process that failed first"),
    Reading(_words(r"(UNAVAILABLE: (Socket closed|failed to connect|Connection reset)|"
                   r"Polled an error from coordination service|[Cc]oordination service has stopped|"
                   r"experiencing network issues|Failed to send RPC to coordination service)"),
            "JAX's coordination service (run by process 0) went away or reported another "
            "process's failure: this one stopped because of it; look at the process that "
            "failed first, or at process 0's log"),
    Reading(_words(r"(ALREADY_EXISTS|Duplicate task registration|already registered)"),
            "the coordinator already had a process with this process_id: a process of an "
            "earlier run of this job still holds the coordinator port; stop it (ssh/tpu: "
            "launch ... --kill-stale) or pick another cluster.coordinator_port"),
    Reading(_words(r"(RESOURCE_EXHAUSTED|Out of memory while trying to allocate|out of memory)",
                   re.I),
            "a device ran out of memory: lower train.global_batch_size, or the model's size"),
    # before the TPU in use: jax says "Unable to initialize backend 'tpu'" for both
    Reading(_words(r"(Failed to open libtpu|libtpu\.so: cannot open|[Nn]o module named '?libtpu)"),
            "libtpu, the TPU's runtime, is not installed in the Python that runs the worker: "
            "install jax's TPU extra there (pip install 'jax[tpu]'; a TPU VM's image has it); "
            "docs/tpu.md"),
    Reading(_words(r"(TPU is already in use|TPU in use by process|Device or resource busy|"
                   r"Unable to initialize backend 'tpu')"),
            "another process holds this host's TPU (a survivor of an earlier run, or someone "
            "else's job): ssh/tpu: launch ... --kill-stale stops podlaunch's own; otherwise "
            "find it with `sudo lsof -w /dev/accel*` or `/dev/vfio/*`"),
    Reading(_words(r"Address already in use"),
            "a port the job needs is taken on that host: pick another "
            "cluster.coordinator_port, or 0 for a free one"),
)


def meaning(tail: Iterable[str]) -> str | None:
    """What the newest line of ``tail`` that a reading matches usually means, or None."""
    for line in reversed(list(tail)):
        for reading in READINGS:
            if reading.matches(line):
                return reading.meaning
    return None


# The last line of a Python traceback: ``ExcName: message`` (module-qualified or not)
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*?)?(?:Error|Exception|ExceptionGroup|Interrupt)"
                             r"(?:: |$| \()")


def follows_from_another(tail: Iterable[str]) -> bool:
    """Whether ``tail`` (a failed process's last lines) says it stopped because another
    process did: gloo cut off from a peer, or JAX's coordination service gone or reporting
    another's failure (the first readings above, and the contract's peer-loss markers that
    supervision's root-cause wait uses), and no error of its own (an exception line, an
    exception group's member, or the worker's ``failed at step N: ...`` line, that is not
    one of those: a task's ``RuntimeError`` stays the cause even when the coordination
    service's shutdown is logged after it). ``launcher.run.classes`` reads a
    failure with such a tail as a consequence, not a cause."""
    lines = list(tail)
    cascade = [wire.is_peer_loss(line) or any(r.matches(line) for r in READINGS[:_CASCADE])
               for line in lines]
    own_error = any(not seen and (_EXCEPTION_LINE.match(line.lstrip(" |")) or isinstance(wire.parse(line), wire.Failed))
                    for line, seen in zip(lines, cascade))
    return any(cascade) and not own_error
