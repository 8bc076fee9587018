"""``host:port`` addresses, IPv6 included: how the coordinator's address is written and read.

Every place that builds or parses a coordinator, MEGASCALE or reach-check address uses
these two (through ``worker.contract``). Standard library only.
"""

from __future__ import annotations


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
