"""Ports the launcher picks or checks on its own machine, and the sentences for not getting one.

Used for the local backend's coordinator and TPU-split ports and for ``launch tensorboard``'s
server. Two ways a port cannot serve, each said at once instead of as a traceback or a wait
until a timeout: no TCP socket can be opened here at all (a sandbox, a seccomp filter: the
errno says which), or the address cannot be reached from this host (the loopback interface
down, as in a fresh network namespace: ``unshare -n``). ``proctl`` holds the mechanism (it
ships to hosts, standard library only); this module the words, which name what needed the port.
"""

from __future__ import annotations

import os
import socket

from launcher import proctl
from launcher.errors import LaunchError
from worker.contract import address

REACH_TRY_S = 1.0  # the one connect of ``check_reachable``: a refusal comes at once on loopback


def no_socket(what: str, host: str, exc: OSError, advice: str) -> str:
    """The sentence for a TCP port that cannot be had at all (``exc``) for ``what`` on ``host``."""
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    return (f"{what} needs a TCP port on {host}, and this machine allows no TCP socket "
            f"({why}, errno {exc.errno}): a sandbox or locked-down host; {advice}")


def free_port(what: str, host: str, advice: str) -> int:
    """``proctl.free_port(host)``, for ``what``.

    Raises:
      LaunchError: no TCP socket can be opened here (``no_socket``'s sentence, ``advice`` last).
    """
    try:
        return proctl.free_port(host)
    except OSError as exc:
        raise LaunchError(no_socket(what, host, exc, advice)) from None


def check_reachable(what: str, host: str, port: int, advice: str) -> None:
    """Connect once to ``host:port`` before anything listens there: a refusal (or a timeout)
    is fine, an error no wait would cure is said now (the loopback interface down gives
    ENETUNREACH: the server would start, and every client wait out its timeout).

    Raises:
      LaunchError: ``host:port`` cannot be reached from this host (the errno's meaning).
    """
    try:
        socket.create_connection((host, port), timeout=REACH_TRY_S).close()
    except OSError as exc:
        said = address.unreachable(host, port, exc)
        if said is not None:
            raise LaunchError(f"{what} at {said}; {advice}") from None
