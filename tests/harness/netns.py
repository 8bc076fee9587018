"""Network namespaces that are other machines' networks, for podlaunch's tests.

``Machines(n)`` makes ``n`` network namespaces, each with its own loopback
and one veth interface whose peer is on a bridge in this (the launcher's)
namespace: the bridge is ``10.X.Y.1/24``, machine i is ``10.X.Y.(i + 2)``.
Every machine reaches this one and each other over the bridge (one layer-2
segment: no routing, no ip_forward); 127.0.0.1 in a machine is that
machine's own. An sshd started in one (``SshTestEnv(namespaces=...)``) is a
host whose programs see that network only; processes still share this
machine's filesystem and process table, so every host's process table is
read here.

With ``own_names`` (the default), this machine's name resolves in each namespace
to that machine's address (``/etc/netns/NAME/hosts``, which ``ip netns exec``
mounts over ``/etc/hosts`` for what it starts): what gloo, JAX's CPU
collectives, gives its peers. Without, the name resolves as here (to
loopback, as Debian's ``127.0.1.1 hostname`` line makes it).

Needs root and ``ip`` (iproute2) with veth and bridge support; ``available()``
says whether this kernel allows them. Names carry this process's id, so
concurrent test sessions do not meet.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def available() -> str | None:
    """None when namespaces with veth and bridges work here, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    probe = f"plprobe{os.getpid() % 100000}"
    try:
        made = _ip("link", "add", probe, "type", "bridge", check=False)
    except FileNotFoundError:
        return "needs ip (apt-get install iproute2)"
    if made.returncode != 0:
        return f"cannot make a bridge: {made.stderr.strip()}"
    _ip("link", "del", probe, check=False)
    return None


class Machines:
    """``count`` network namespaces on one bridge; a context manager that removes them all."""

    def __init__(self, count: int, own_names: bool = True, tag: int = 0):
        tag = os.getpid() % 10000 * 10 + tag  # distinct per test session, and per Machines in it
        self.own_names = own_names
        self.bridge = f"plbr{tag}"
        subnet = 64 + tag % 160, tag // 160 % 250
        self.prefix = f"10.{subnet[0]}.{subnet[1]}"
        self.gateway = f"{self.prefix}.1"
        self.names = [f"plm{tag}-{i}" for i in range(count)]
        self.addresses = [f"{self.prefix}.{i + 2}" for i in range(count)]

    def namespaces(self, first_host: int = 0) -> dict:
        """For ``SshTestEnv(namespaces=...)``: host index -> (namespace, address)."""
        return {first_host + i: (n, a) for i, (n, a) in enumerate(zip(self.names, self.addresses))}

    def __enter__(self) -> "Machines":
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, (name, address) in enumerate(zip(self.names, self.addresses)):
                outside, inside = f"{self.bridge}o{i}", f"{self.bridge}i{i}"
                _ip("netns", "add", name)
                _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
                _ip("link", "set", inside, "netns", name)
                _ip("link", "set", outside, "master", self.bridge)
                _ip("link", "set", outside, "up")
                _ip("-n", name, "link", "set", "lo", "up")
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", inside)
                _ip("-n", name, "link", "set", inside, "up")
                if self.own_names:
                    os.makedirs(f"/etc/netns/{name}", exist_ok=True)
                    with open(f"/etc/netns/{name}/hosts", "w") as f:
                        f.write(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for name in self.names:  # its veth ends go with it
            _ip("netns", "del", name, check=False)
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
        _ip("link", "del", self.bridge, check=False)
