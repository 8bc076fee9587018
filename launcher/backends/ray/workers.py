"""A worker process on a Ray node, as the launcher sees it: its lines and how it ended read
from its bundle's actor (``launcher.backends.ray.host.ProcessHost``), its signals sent
through it. An actor that Ray reports gone (its node lost, its raylet stopped, the actor
killed) is a lost process, ``Lost``: an infrastructure fault, restarted from the agreed
checkpoint."""

from __future__ import annotations

import re
import threading
from typing import Iterator

from launcher.ends import Exit, Lost
from launcher.plan import ProcessPlan

READ_WAIT_S = 1.0  # how long one read waits on the node for a line
CALL_S = 10.0  # an actor call that takes longer: its node is not answering


class RayWorker:
    """One planned process in its bundle's actor on node ``node``."""

    def __init__(self, plan: ProcessPlan, actor, node: str, ray):
        self.plan, self.actor, self.node, self._ray = plan, actor, node, ray
        self._end: Exit | None = None
        self._eof = threading.Event()

    def lines(self) -> Iterator[str]:
        try:
            while True:
                try:
                    got, end = self._ray.get(self.actor.read.remote(READ_WAIT_S),
                                             timeout=READ_WAIT_S + CALL_S)
                except Exception as exc:  # noqa: BLE001 - Ray's errors: the actor is gone
                    self._end = Lost(f"its Ray actor on node {self.node} is gone "
                                     f"({gone_why(exc)})")
                    return
                yield from got
                if end is not None:
                    self._end = end
                    return
        finally:
            self._eof.set()

    def poll(self) -> Exit | None:
        return self._end if self._eof.is_set() else None

    def _call(self, method, *args):
        try:
            return self._ray.get(method.remote(*args), timeout=CALL_S)
        except Exception:  # noqa: BLE001 - gone: lines() says how
            return None

    def terminate(self) -> None:
        self._call(self.actor.signal, "terminate")

    def kill(self) -> None:
        self._call(self.actor.signal, "kill")

    def stopped(self) -> bool:
        return bool(self._call(self.actor.stopped))

    def dump_stacks(self) -> None:
        self._call(self.actor.stacks)

    def request_profile(self, text: str, failed=None) -> None:
        try:
            self._ray.get(self.actor.profile.remote(text), timeout=CALL_S)
        except Exception as exc:  # noqa: BLE001
            raise OSError(f"node {self.node}: {gone_why(exc)}") from None


def gone_why(exc: BaseException) -> str:
    """Ray's error in one line: its class and the first sentence of its text, without the
    actor's id (``ActorUnavailableError: The actor is unavailable: ... Socket closed``)."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    first = re.sub(r"\b(actor|Actor) [0-9a-f]{16,} ", r"\1 ", first).split(". ", 1)[0]
    return f"{type(exc).__name__}: {first}"[:200]
