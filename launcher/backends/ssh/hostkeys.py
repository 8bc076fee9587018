"""Host keys checked as OpenSSH checks them, on every hop of a connection.

paramiko's own check (``SSHClient.connect`` with known_hosts loaded) differs
from OpenSSH's in ways users meet:

* it asks the server for the type of the *first* known_hosts line of a host
  only, so a host with an old RSA line and a current ECDSA line hands over
  its new RSA key, which paramiko calls a changed key. OpenSSH offers every
  type known_hosts has for the host first (``order_hostkeyalgs`` in
  sshconnect2.c), in its usual preference order, then the others;
* a key is "changed" only when known_hosts has a key *of the same type* for
  the host and it differs; a host presenting a type known_hosts lacks is
  unknown, not changed (refused by ``strict``, recorded by ``accept-new``);
* known_hosts patterns (``*``, ``?``, ``!``) and hashed names are matched as
  in sshd(8)'s SSH_KNOWN_HOSTS FILE FORMAT;
* a key on a ``@revoked`` line for the host is refused whatever else the
  files say (``RevokedHostKey``, with OpenSSH's "REVOKED HOST KEY DETECTED"),
  as sshconnect.c's check_host_key does before any other check;
* ``@cert-authority`` lines: paramiko cannot verify host certificates, so
  they vouch for nothing here; a host whose only entries are CA lines is
  refused as unknown, with a message that says so (``UnknownHostKey.ca_only``).

``KnownHostsPolicy`` does the whole check (the client is given no host keys
of its own, so paramiko consults it for every key) and ``offer_known_types``
orders the key types a transport offers (and its ciphers: AES-GCM first).
``connection.Host.open`` applies both to the target and to each ``ProxyJump``
hop, with that hop's own known_hosts and policy: fabric opens jump connections
with ``AutoAddPolicy``. It also hands paramiko the first identity file already
loaded (``identities``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import threading
from typing import Iterable

import paramiko
from paramiko.hostkeys import HostKeyEntry, HostKeys, InvalidHostKey


class UnknownHostKey(paramiko.SSHException):
    """The host's key is not in known_hosts and the policy is strict.

    Attributes:
      hostname: as looked up in known_hosts (``[host]:port`` when the port is not 22).
      key: the key the host presented.
      known_types: key types known_hosts does have for the host (may be empty).
    """

    def __init__(self, hostname: str, key, known_types: list, known_hosts_file: str,
                 ca_only: bool = False):
        self.hostname, self.key, self.known_types = hostname, key, known_types
        self.ca_only = ca_only
        also = f" (it has {', '.join(known_types)} for it)" if known_types else ""
        if ca_only:
            also += (" (only @cert-authority lines match it: podlaunch cannot check host "
                     "certificates; add the host's own key)")
        super().__init__(f"no {key.get_name()} key for {hostname} in {known_hosts_file}{also}")


class RevokedHostKey(paramiko.SSHException):
    """The host presented a key that a ``@revoked`` line in known_hosts names.

    Attributes:
      hostname: as looked up in known_hosts.
      key: the revoked key.
      known_hosts_file: the file whose line revokes it.
    """

    def __init__(self, hostname: str, key, known_hosts_file: str):
        self.hostname, self.key, self.known_hosts_file = hostname, key, known_hosts_file
        super().__init__(f"REVOKED HOST KEY DETECTED: the {key.get_name()} host key for {hostname} "
                         f"is marked as revoked in {known_hosts_file}")


def _pattern_matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):
        return HostKeys.hash_host(name, pattern) == pattern
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name, re.IGNORECASE) is not None


def names_match(patterns: Iterable[str], name: str) -> bool:
    """Whether known_hosts ``patterns`` (one line's names) cover ``name``; a matching ``!`` pattern vetoes."""
    matched = False
    for pattern in patterns:
        if pattern.startswith("!"):
            if _pattern_matches(pattern[1:], name):
                return False
        elif _pattern_matches(pattern, name):
            matched = True
    return matched


class _Parsed:
    """One known_hosts file read once: its entries by marker, plain names indexed.

    A host's check used to read and parse the whole file again, so a launch over N hosts
    parsed N files of N lines: 0.39 s of the launcher's CPU at 32 hosts
    (bench/bench_launch_scale.py). Lines whose names are all plain (no wildcard, negation
    or hash) are found by name; the others are matched line by line as before.
    """

    def __init__(self, text: str):
        self.by_name: dict = {}   # (marker, lowered name) -> [(lineno, key)]
        self.patterned: list = []  # (marker, lineno, names, key)
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            marker = None
            if line.startswith("@"):
                marker, _, line = line.partition(" ")
                line = line.strip()
            try:
                entry = HostKeyEntry.from_line(line, lineno)
            except (InvalidHostKey, ValueError):
                continue
            if entry is None:
                continue
            if any(c in n for n in entry.hostnames for c in "*?!") or any(
                    n.startswith("|1|") for n in entry.hostnames):
                self.patterned.append((marker, lineno, entry.hostnames, entry.key))
                continue
            for n in dict.fromkeys(n.lower() for n in entry.hostnames):
                self.by_name.setdefault((marker, n), []).append((lineno, entry.key))

    def keys(self, name: str, marker: str | None) -> list:
        found = list(self.by_name.get((marker, name.lower()), ()))
        found += [(lineno, key) for m, lineno, names, key in self.patterned
                  if m == marker and names_match(names, name)]
        return [key for _, key in sorted(found, key=lambda item: item[0])]


_parsed: dict = {}  # path -> ((mtime_ns, size, inode), _Parsed)
_parsed_lock = threading.Lock()


def known_keys(known_hosts_file: str, name: str, marker: str | None = None) -> list:
    """The keys (paramiko ``PKey``s) ``known_hosts_file`` holds for ``name``, in file order.

    Args:
      marker: None for plain lines; ``"@revoked"`` or ``"@cert-authority"`` for the
        keys of the lines with that marker.

    A missing file holds none; lines paramiko cannot read (unknown key types)
    are skipped. The file is parsed once while it is unchanged (its mtime, size and
    inode), so that the checks of many hosts do not each parse it again.
    """
    try:
        with open(known_hosts_file, "rb") as f:
            stat = os.fstat(f.fileno())
            version = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            with _parsed_lock:
                cached = _parsed.get(known_hosts_file)
            if cached is None or cached[0] != version:
                cached = (version, _Parsed(f.read().decode("utf-8", errors="replace")))
                with _parsed_lock:
                    _parsed[known_hosts_file] = cached
    except FileNotFoundError:
        return []
    return cached[1].keys(name, marker)


def known_hosts_name(host: str, port: int) -> str:
    """How OpenSSH names ``host:port`` in known_hosts: bare for port 22, else ``[host]:port``."""
    return host if int(port) == 22 else f"[{host}]:{port}"


@dataclasses.dataclass(frozen=True)
class KeyCheck:
    """How one host's key is checked.

    Attributes:
      known_hosts_file: read for the host's keys; ``accept-new`` appends to it
        (OpenSSH's first ``UserKnownHostsFile``).
      policy: ``strict`` or ``accept-new``.
      also_read: more files read, never written (the other user files and
        ``GlobalKnownHostsFile``, e.g. /etc/ssh/ssh_known_hosts).
    """

    known_hosts_file: str
    policy: str
    also_read: tuple = ()

    def keys_for(self, name: str, marker: str | None = None) -> list:
        """The keys every file holds for ``name`` (``known_keys``), in file order."""
        return [k for f in (self.known_hosts_file, *self.also_read)
                for k in known_keys(f, name, marker)]

    def revoked_in(self, name: str, key) -> str | None:
        """The file whose ``@revoked`` line names ``key`` (for ``name``), or None."""
        for f in (self.known_hosts_file, *self.also_read):
            if any(k == key for k in known_keys(f, name, "@revoked")):
                return f
        return None


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """OpenSSH's verdict on the key a host presented (``StrictHostKeyChecking`` yes or accept-new).

    Args:
      check: the files and the policy (``KeyCheck``).

    ``missing_host_key`` raises ``paramiko.BadHostKeyException`` when
    known_hosts has a different key of the presented type, ``UnknownHostKey``
    when it has none of that type and the policy is strict; else it accepts.
    """

    _lock = threading.Lock()  # accept-new appends: one writer at a time

    def __init__(self, check: KeyCheck):
        self.check = check
        self.known_hosts_file, self.policy = check.known_hosts_file, check.policy

    def missing_host_key(self, client, hostname, key):
        revoked_by = self.check.revoked_in(hostname, key)
        if revoked_by is not None:  # first, as OpenSSH: no other line can vouch for it
            raise RevokedHostKey(hostname, key, revoked_by)
        known = self.check.keys_for(hostname)
        same_type = [k for k in known if k.get_name() == key.get_name()]
        if any(k == key for k in same_type):
            return
        if same_type:
            raise paramiko.BadHostKeyException(hostname, key, same_type[0])
        if self.policy != "accept-new":
            raise UnknownHostKey(hostname, key, sorted({k.get_name() for k in known}),
                                 self.known_hosts_file,
                                 ca_only=not known and bool(self.check.keys_for(hostname,
                                                                               "@cert-authority")))
        with self._lock:
            os.makedirs(os.path.dirname(self.known_hosts_file) or ".", exist_ok=True)
            with open(self.known_hosts_file, "a", encoding="utf-8") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


# Offered first where paramiko has them (offer_known_types)
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _key_type(algorithm: str) -> str:
    """The known_hosts key type a host key algorithm verifies (``rsa-sha2-512`` -> ``ssh-rsa``)."""
    return "ssh-rsa" if algorithm.startswith("rsa-sha2-") else algorithm


class _Transport(paramiko.Transport):
    """paramiko's Transport, its thread waking once a second instead of ten times when
    nothing arrives.

    The thread reads its socket with this timeout, and each timeout is a pass of Python
    that only checks whether the transport was closed or a keepalive or rekey is due:
    ten a second for every connection, for the whole run, which with many hosts is a
    share of the launcher's CPU that grows with the host count (docs/ssh.md, "The
    launcher's own cost per host"). Data and a peer's close wake it at once; what waits
    longer is only a closed transport's thread ending (this launcher's own keepalive
    and lost-host checks do not depend on it).
    """

    _active_check_timeout = 1.0  # paramiko's is 0.1 s


def offer_known_types(known_types: set):
    """A paramiko ``transport_factory`` that offers the server ``known_types`` first.

    Among them and among the rest paramiko's preference order stays, as OpenSSH
    keeps its own. With no known types the order is paramiko's.

    The ciphers offered are paramiko's own, with the AES-GCM ones first
    (``AEAD_CIPHERS``, RFC 5647 as OpenSSH names them, where this paramiko has them):
    with paramiko's first choice, ``aes128-ctr`` and ``hmac-sha2-256``, every
    packet's MAC is compared byte by byte in Python, and at many hosts that is a
    measurable part of the launcher's CPU (docs/ssh.md, "The launcher's own cost
    per host"); GCM checks each packet's tag inside ``cryptography``. A server that
    offers no GCM cipher gets the rest in paramiko's order, as before.
    """
    def make(sock, disabled_algorithms=None):
        transport = _Transport(sock, disabled_algorithms=disabled_algorithms)
        options = transport.get_security_options()
        first = [a for a in options.key_types if _key_type(a) in known_types]
        options.key_types = first + [a for a in options.key_types if a not in first]
        aead = [c for c in AEAD_CIPHERS if c in options.ciphers]
        options.ciphers = aead + [c for c in options.ciphers if c not in aead]
        return transport
    return make


def prepare(client: paramiko.SSHClient, host: str, port: int, check: KeyCheck) -> dict:
    """Set ``client`` up to check ``host:port``'s key; returns the connect kwargs that go with it.

    The client keeps no host keys of its own (paramiko would check them its
    way first): ``KnownHostsPolicy`` sees every key.
    """
    client.get_host_keys().clear()
    client.set_missing_host_key_policy(KnownHostsPolicy(check))
    types = {k.get_name() for k in check.keys_for(known_hosts_name(host, port))}
    return {"transport_factory": offer_known_types(types)}


def _stamp(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


@functools.lru_cache(maxsize=16)
def _loaded(path: str, key_stamp: tuple, cert_stamp: tuple | None) -> paramiko.PKey | None:
    try:
        return paramiko.PKey.from_path(path)  # its "-cert.pub" too, as paramiko's own load
    except Exception:  # noqa: BLE001  encrypted, unknown, unreadable: paramiko's path says why
        return None


def identities(key_files: list, connect_kwargs: dict) -> dict:
    """``connect_kwargs``' identity entries for paramiko with the first of ``key_files``
    loaded once per launch (while it and its ``-cert.pub`` are unchanged) and given as
    ``pkey``.

    paramiko's ``SSHClient`` loads each ``key_filename`` on every connection, trying each
    key class in turn (an ed25519 key is parsed as RSA and ECDSA first): about 0.4 ms of
    the launcher's CPU per host (docs/ssh.md). paramiko tries ``pkey`` first, then the
    other files, then the agent: the order is the same. A key it cannot load without a
    passphrase (or any key, where one is given) is left to paramiko as before.
    """
    if not key_files or "pkey" in connect_kwargs or connect_kwargs.get("passphrase") or \
            connect_kwargs.get("password") or not hasattr(paramiko.PKey, "from_path"):
        return {"key_filename": key_files}
    path = os.path.abspath(key_files[0])
    key_path = path[:-len("-cert.pub")] if path.endswith("-cert.pub") else path
    key_stamp = _stamp(key_path)
    if key_stamp is None:
        return {"key_filename": key_files}
    # loaded again when the key or its certificate changed (a renewed short-lived certificate)
    key = _loaded(path, key_stamp, _stamp(key_path + "-cert.pub"))
    return {"key_filename": key_files} if key is None else {"pkey": key,
                                                             "key_filename": key_files[1:]}
