"""The launcher's SIGTERM as ``SystemExit``, held back while a worker writes its records.

The launcher stops a worker with SIGTERM (then SIGKILL after ``cluster.grace_s``).
A worker turns it into ``SystemExit(128 + SIGTERM)`` (exit code 143), so its
``finally`` blocks write what process 0 holds and close the TensorBoard writer.

A Python signal handler runs between any two bytecodes of the main thread, so an
exception raised from it can land in the middle of the code that hands records
on: between printing a batch of progress lines and keeping their values for
TensorBoard (the values were gone: printed, never written), or inside the
``finally`` that writes them. ``held()`` marks such code: a SIGTERM that arrives
inside it is remembered and raised when the outermost ``held()`` block ends.
Code inside may still block (a device wait); a worker blocked in JAX cannot
act on SIGTERM anyway, and the launcher's SIGKILL ends it.

Source of the semantics relied on: Python's ``signal`` module documentation
(handlers run in the main thread between bytecode instructions; an exception
they raise propagates from wherever that thread was).
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import sys
from typing import Callable, Iterator

from worker.contract.signals import STACKS_SIGNAL, exit_code

_state: dict = {"depth": 0, "pending": None, "on_signal": None, "notice": None}


def _on_sigterm(signum: int, frame) -> None:
    if _state["on_signal"] is not None:
        _state["on_signal"](signum)
    if _state["notice"] is not None:  # inside notices(): a preemption notice, not an exit
        _state["notice"](signum)
        return
    if _state["depth"]:
        _state["pending"] = signum
        return
    raise SystemExit(exit_code(signum))


def install(on_signal: Callable[[int], None] | None = None) -> None:
    """Make SIGTERM raise ``SystemExit(143)`` in the main thread, except inside ``held()``.

    Call it again after ``jax.distributed.initialize``, which installs a SIGTERM
    handler of its own (its preemption notifier's) that swallows the launcher's TERM.

    Args:
      on_signal: called with the signal number as soon as one arrives, held or not
        (a program records that it was terminated).
    """
    if on_signal is not None:
        _state["on_signal"] = on_signal
    signal.signal(signal.SIGTERM, _on_sigterm)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold a SIGTERM back until this block (the outermost, when nested) ends.

    Raises:
      SystemExit: (at the end of the block) 143 when a SIGTERM arrived inside it.
    """
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        if not _state["depth"] and _state["pending"] is not None:
            signum, _state["pending"] = _state["pending"], None
            raise SystemExit(exit_code(signum))


@contextlib.contextmanager
def notices(on_notice: Callable[[int], None] | None) -> Iterator[None]:
    """Inside this block a SIGTERM is a preemption notice: ``on_notice(signum)`` is called
    (from the handler: it must take no lock the main thread may hold) and nothing is
    raised; the training loop stops at the step every process agrees on
    (``worker.recovery.notice``). None: SIGTERM raises as outside.
    """
    previous, _state["notice"] = _state["notice"], on_notice
    try:
        yield
    finally:
        _state["notice"] = previous


# ---- stacks on request (the signal and the dump's format: worker.contract.signals) ----
def answer_stack_requests() -> None:
    """On ``STACKS_SIGNAL``, write every thread's Python stack to stderr (``faulthandler``).

    The dump is written by the C signal handler itself, not by a Python handler between
    bytecodes, so a main thread blocked in C code (a sleep, a blocking read, a collective)
    still answers; the process goes on as before.
    """
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
