"""Can this host reach host 0's coordinator address? Both ends of the check (shipped by source).

JAX's workers all connect to ``coordinator_address``; process 0 serves it,
bound to every interface (``[::]:port``, jax/_src/distributed.py's default
``coordinator_bind_address``). An address some host cannot reach (host 0 named
``localhost``, or by a name that resolves to 127.x there, as Debian's
``127.0.1.1 hostname`` line does; a firewall) shows only as each worker's
initialization timeout and a SIGABRT. So preflight tries the real thing
first, one role per call:

* ``listen`` (host 0): bind ``port`` as the coordinator will, print ``MARK`` +
  ``{"listening": port}`` (or ``{"error": why}``), answer each connection with
  ``token``, and end after ``count`` connections (null: no such end), when stdin ends (the
  launcher closed the channel), or after ``timeout_s``.
* ``connect`` (every host): resolve ``address`` (``host:port``) here, connect
  within ``timeout_s``, read the token; print ``MARK`` + ``{"ok": bool,
  "resolved": ip or null, "error": why or null}``. Another program that
  happens to listen on that port here does not send the token: not ok. The
  answer also says what gloo (JAX's CPU collectives) will tell this host's
  peers to connect to: ``hostname`` and ``hostname_address``, the first
  address it resolves to here (gloo's tcp device, given no hostname or
  interface, as jax/_src/xla_bridge.py gives it none, binds and advertises
  that; Debian's ``127.0.1.1 hostname`` line makes it loopback), and
  ``network``, this machine's boot id and network namespace (hosts that share
  one share their loopback).

Args (one JSON object): ``role``, ``token``, ``timeout_s``, and ``port`` and
``count`` (listen) or ``address`` (connect).
"""

import json
import os
import select
import socket
import sys
import time

MARK = "podlaunch-reach "


def _say(out):
    print(MARK + json.dumps(out), flush=True)


def _bind(port):
    """A listening socket on every interface, as the coordinator: dual-stack ``::``, or
    ``0.0.0.0`` where IPv6 is off (no AF_INET6 socket, or ``::`` not bindable)."""
    try:
        return _listen(socket.AF_INET6, "::", port)
    except OSError:
        return _listen(socket.AF_INET, "", port)


def _listen(family, host, port):
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(64)
    except OSError:
        s.close()
        raise
    return s


def listen(args):
    try:
        server = _bind(int(args["port"]))
    except OSError as exc:
        _say({"error": "cannot listen on port %d: %s" % (args["port"], exc.strerror or exc)})
        return 1
    _say({"listening": int(args["port"])})
    token = args["token"].encode()
    deadline = time.monotonic() + float(args["timeout_s"])
    answered = 0
    watch = [server, sys.stdin]
    try:
        limit = args.get("count")
        while limit is None or answered < int(limit):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(watch, [], [], left)
            if sys.stdin in ready and not sys.stdin.buffer.read1(4096):
                break  # the launcher is done with us
            if server in ready:
                conn, _ = server.accept()
                try:
                    conn.settimeout(2.0)
                    conn.sendall(token)
                    conn.recv(1)  # the caller closes first: no TIME_WAIT on the coordinator's port
                except OSError:
                    pass
                finally:
                    conn.close()
                answered += 1
    finally:
        server.close()
    return 0


def connect(args):
    host, _, port = args["address"].rpartition(":")
    host = host.strip("[]")
    timeout_s = float(args["timeout_s"])
    out = {"ok": False, "resolved": None, "error": None}
    out.update(identity())
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host, int(port), 0, socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        out["error"] = "cannot resolve %r here (%s)" % (host, exc.strerror)
        _say(out)
        return out
    out["resolved"] = where[0]
    try:
        s = socket.socket(family, kind, proto)
    except OSError as exc:  # a sandbox: no socket of this family at all
        out["error"] = "this host allows no TCP socket (%s)" % (exc.strerror or exc)
        _say(out)
        return out
    s.settimeout(timeout_s)
    try:
        s.connect(where)
        got = b""
        while len(got) < len(args["token"]):
            data = s.recv(64)
            if not data:
                break
            got += data
        if got == args["token"].encode():
            out["ok"] = True
        else:
            out["error"] = "another program answers there, not host 0's coordinator port"
    except socket.timeout:
        out["error"] = "no answer within %g s (a firewall, or no route)" % timeout_s
    except OSError as exc:
        out["error"] = (exc.strerror or str(exc)).lower()
    finally:
        s.close()
    _say(out)
    return out


def identity():
    """``hostname``, ``hostname_address`` (None if it does not resolve) and ``network``."""
    name = socket.gethostname()
    try:
        address = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror:
        address = None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        network = "%s/%d" % (boot, os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        network = None
    return {"hostname": name, "hostname_address": address, "network": network}


def main(args):
    return listen(args) if args["role"] == "listen" else connect(args)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
