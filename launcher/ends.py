"""How a worker process ended: ``Exit``, a small union told apart by type, and ``exit_of``,
an end from what a host reported. Backends build them, ``launcher.state.Tracked`` holds one
per process, and ``launcher.run.classes`` reads them (one ``match``) to class an attempt.
"""

from __future__ import annotations

import dataclasses
import signal


@dataclasses.dataclass(frozen=True)
class Exit:
    """How a worker ended: one of the small types below, told apart by type.

    ``Exited`` (an exit code), ``Killed`` (a signal), ``Lost`` (it can no longer be
    watched; ``Preempted`` when a scheduler said why), ``Stalled`` (the watchdog's verdict), ``EndedEarly`` (exit code 0 before
    its last step), ``Final`` (its scheduler ended it as a restart would repeat). Only
    ``Exited(0)`` is a success. ``at``: the wall-clock time it ended as its own host
    saw it (ssh, local), when known.
    """

    at: float | None = dataclasses.field(default=None, kw_only=True)

    @property
    def ok(self) -> bool:
        return False


@dataclasses.dataclass(frozen=True)
class Exited(Exit):
    code: int

    @property
    def ok(self) -> bool:
        return self.code == 0

    def __str__(self) -> str:
        return f"exit code {self.code}"


@dataclasses.dataclass(frozen=True)
class Killed(Exit):
    signal: int

    def __str__(self) -> str:
        try:
            return f"killed by {signal.Signals(self.signal).name}"
        except ValueError:
            return f"killed by signal {self.signal}"


@dataclasses.dataclass(frozen=True)
class Lost(Exit):
    why: str  # why the worker can no longer be watched

    def __str__(self) -> str:
        return f"lost: {self.why}"


@dataclasses.dataclass(frozen=True)
class Preempted(Lost):
    """Lost after a notice: its scheduler preempted it (a Slurm job being preempted or
    requeued). A ``Lost`` everywhere else; ``launcher.run.classes`` counts it a preemption."""

    def __str__(self) -> str:
        return f"preempted: {self.why}"


@dataclasses.dataclass(frozen=True)
class Stalled(Exit):
    what: str  # alive, no step progress: for how long, and where

    def __str__(self) -> str:
        return f"stalled: {self.what}"


@dataclasses.dataclass(frozen=True)
class EndedEarly(Exit):
    where: str  # exit code 0, but before its last step: where it stopped

    def __str__(self) -> str:
        return f"exit code 0 {self.where}"


@dataclasses.dataclass(frozen=True)
class Final(Exit):
    why: str  # e.g. a time limit: the scheduler would end a restart the same way

    def __str__(self) -> str:
        return self.why


def exit_of(code: int | None = None, signal_number: int | None = None,
            at: float | None = None) -> Exit:
    """A process's end from what its host reported: a signal, else an exit code
    (``Popen.returncode``'s negative code is a signal)."""
    if signal_number is not None:
        return Killed(signal_number, at=at)
    if code is not None and code < 0:
        return Killed(-code, at=at)
    return Exited(code if code is not None else 0, at=at)
