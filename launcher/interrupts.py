"""The one place the launcher installs signal handlers: Ctrl-C, SIGTERM and SIGHUP, and the
requests for stacks and profiles of a live run (``stacks_requests``).

Every stage that must react to an interrupt (the CLI before processes start, the
start itself, supervision, the wait before a restart, a Slurm job that is still
pending, ``launch tensorboard``) uses ``handled``, so the same rules hold
everywhere:

* the signals are SIGINT, SIGTERM and SIGHUP (a closed terminal);
* a SIGHUP that is ignored when the launcher starts (``nohup launch ...``) stays
  ignored: the user asked for the run to outlive the terminal;
* the previous handlers come back when the block ends, however it ends.

Stdlib only.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator


class Interrupted(Exception):
    """Ctrl-C, SIGTERM or SIGHUP reached the launcher (its signal's name as the message)."""


def raise_interrupted(signum, frame):
    """A handler: raise ``Interrupted``."""
    raise Interrupted(signal.Signals(signum).name)


def raise_keyboard_interrupt(signum, frame):
    """A handler: raise ``KeyboardInterrupt`` named after the signal (as Ctrl-C would)."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def interrupt_signals() -> tuple:
    """The signals that stop a run in order: SIGINT, SIGTERM, and SIGHUP unless ignored."""
    sigs = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        sigs.append(signal.SIGHUP)
    return tuple(sigs)


def install(handler: Callable) -> dict:
    """Install ``handler`` for ``interrupt_signals()``; returns the previous handlers
    (give them to ``restore``). Prefer ``handled``."""
    return {sig: signal.signal(sig, handler) for sig in interrupt_signals()}


def restore(previous: dict) -> None:
    """Put back the handlers ``install`` returned."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@contextlib.contextmanager
def handled(handler: Callable = raise_interrupted) -> Iterator[None]:
    """``handler`` for every interrupt signal while the block runs, the previous ones after."""
    previous = install(handler)
    try:
        yield
    finally:
        restore(previous)


# ``launch stacks RUN`` asks the run's live launcher (run.json's pid) with this signal for
# every process's stacks (launcher.run.stacks); supervision answers between two polls.
STACKS_REQUEST_SIGNAL = signal.SIGUSR2
stacks_requested = threading.Event()
# ``launch profile RUN`` asks with this one, its request in the run directory
# (launcher.run.profiles); a stray one finds no request and changes nothing.
PROFILE_REQUEST_SIGNAL = signal.SIGUSR1
profile_requested = threading.Event()


@contextlib.contextmanager
def stacks_requests() -> Iterator[None]:
    """Set ``stacks_requested`` on each ``STACKS_REQUEST_SIGNAL`` (``profile_requested`` on each
    ``PROFILE_REQUEST_SIGNAL``) while the block runs (the
    whole launch: the signal's default action would end the launcher); the previous
    handler after."""
    previous = signal.signal(STACKS_REQUEST_SIGNAL, lambda signum, frame: stacks_requested.set())
    before = signal.signal(PROFILE_REQUEST_SIGNAL, lambda signum, frame: profile_requested.set())
    try:
        yield
    finally:
        signal.signal(STACKS_REQUEST_SIGNAL, previous)
        signal.signal(PROFILE_REQUEST_SIGNAL, before)
