"""Where the harness's servers (sshd, slurmctld, slurmd) listen on this machine.

Each checkout and each pytest-xdist worker looks in its own range of ports, and every
pick holds one machine-wide lock until its server listens. Two test runs of two
checkouts side by side (two CI runs at once on one machine) otherwise picked the same
free port on the same loopback addresses: ranges that depended on the xdist worker
alone were shared between the checkouts, and a port found free could be taken by the
other run before its sshd bound it. Ranges stay below Linux's ephemeral ports
(32768-60999, ``net.ipv4.ip_local_port_range``), which clients' sockets take.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from pathlib import Path

CHECKOUT_SLOTS = 32  # checkouts whose ranges differ; two may share one (the lock still holds)
LOCK_PATH = Path("/tmp/podlaunch-test-ports.lock")


def checkout_slot() -> int:
    """0..CHECKOUT_SLOTS-1 from this checkout's path: the same for all of a run's workers."""
    root = Path(__file__).resolve().parents[2]
    return int(hashlib.sha256(str(root).encode()).hexdigest(), 16) % CHECKOUT_SLOTS


def xdist_worker() -> int:
    """This pytest-xdist worker's number (gw3 -> 3), 0 without xdist; at most 9 (.ci/run
    runs gw0-gw2, gw7 for its newest-end session, and gw0-gw1 again for its Slurm tests,
    which start no sshd and take their ports free under the lock)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    return int(name) if name.isdigit() else 0


def first_port(base: int, per_checkout: int, per_worker: int) -> int:
    """The first port of this checkout's and worker's range: ``base + slot * per_checkout
    + worker * per_worker`` (the caller keeps its ranges apart and below 32768)."""
    return base + checkout_slot() * per_checkout + xdist_worker() * per_worker


@contextlib.contextmanager
def claiming():
    """Hold the machine-wide lock: pick a free port and start its server inside it."""
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
