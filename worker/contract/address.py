"""``host:port`` addresses, IPv6 included: how the coordinator's address is written and read.

Every place that builds or parses a coordinator, MEGASCALE or reach-check address uses
these two (through ``worker.contract``). Standard library only.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket


def host_port(host: str, port) -> str:
    """``host:port`` as gRPC and JAX read it: an IPv6 address in brackets (``[::1]:8476``,
    RFC 3986 section 3.2.2); ``host`` may come bracketed already. Unbracketed, ``::1:8476``
    is taken as a host of its own and every process waits out its join timeout (jax #33251)."""
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(address: str) -> tuple:
    """``(host, port)`` of ``host:port`` or ``[v6 address]:port``, the host without brackets.

    Raises:
      ValueError: no port, a port that is not a number, or an unbracketed IPv6 address
        (its last group cannot be told from a port).
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"expected host:port, got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1], int(port)
    if ":" in host:
        raise ValueError(f"{address!r}: an IPv6 address needs brackets, e.g. [{host}]:{port}")
    return host, int(port)


# connect() errors that waiting cannot cure: this host has no way to the address at all (no
# route, the interface down, no address of that family), unlike a refusal or a timeout, which
# a coordinator that is not up yet gives too. Not EADDRNOTAVAIL: on connect it also means this
# host's ephemeral ports ran out for a moment (many processes joining at once), which passes.
UNREACHABLE_ERRNOS = frozenset(getattr(errno, name) for name in (
    "ENETUNREACH", "EHOSTUNREACH", "ENETDOWN", "EHOSTDOWN", "EAFNOSUPPORT",
    "EPROTONOSUPPORT", "EPERM", "EACCES") if hasattr(errno, name))


def unreachable(host: str, port: int, exc: OSError) -> str | None:
    """Why ``host:port`` cannot be reached from this host at all, from the connect error
    ``exc`` (one of ``UNREACHABLE_ERRNOS``), or None for an error that retrying may cure
    (refused, timed out: nothing listens there yet).

    A loopback address (``127.x``, ``::1``, ``localhost``) unreachable means the loopback
    interface is down (a fresh network namespace: ``unshare -n``); the words say so.
    """
    if exc.errno not in UNREACHABLE_ERRNOS:
        return None
    why = os.strerror(exc.errno)
    if is_loopback(host):
        cause = "the loopback interface is down here (ip link set lo up), or a sandbox forbids it"
    else:
        cause = "no route from this host to it, or a sandbox forbids it"
    return (f"{host_port(host, port)} cannot be reached from this host ({why}, errno "
            f"{exc.errno}): {cause}; waiting would not change that")


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP, or a name resolved here) is a loopback address."""
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        try:
            return ipaddress.ip_address(socket.gethostbyname(address)).is_loopback
        except (OSError, ValueError):
            return False
