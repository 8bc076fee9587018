"""Hosts without a network, for podlaunch's tests: no TCP socket at all, or the loopback down.

``no_socket_env`` is an environment whose every Python (the launcher, each worker: a
sitecustomize runs at each interpreter's start) fails to make any AF_INET/AF_INET6 socket as
the kernel fails it there: EAFNOSUPPORT on a machine that allows none (the TPU test machine),
EPERM under a seccomp filter or a sandbox. ``loopback_down`` is the command prefix that runs
a program in a fresh network namespace (``unshare -n``), whose loopback interface is down:
sockets open and bind, but 127.0.0.1 is unreachable (ENETUNREACH).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from harness.helpers import REPO, env_for_tests

NO_INET = textwrap.dedent("""
    import errno, os, socket
    _socket = socket.socket
    _errno = getattr(errno, os.environ.get("NO_INET_ERRNO", "EAFNOSUPPORT"))
    class socket_without_inet(_socket):
        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            if fileno is None and family in (-1, socket.AF_INET, socket.AF_INET6):
                raise OSError(_errno, os.strerror(_errno))
            super().__init__(family, type, proto, fileno)
    socket.socket = socket_without_inet
""")


def no_socket_env(tmp_path, errno_name: str = "EAFNOSUPPORT") -> dict:
    """``env_for_tests()`` where no TCP socket can be made: each fails with ``errno_name``."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_INET)
    env = env_for_tests(NO_INET_ERRNO=errno_name)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    return env


def loopback_down() -> list:
    """``["unshare", "-n"]``: what runs after it has a network namespace of its own, its
    loopback down. Skips the test where this machine does not allow it (not root, no unshare,
    a container without CAP_SYS_ADMIN)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) for a network namespace with the loopback down")
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare -n is not permitted here ({probe.stderr.strip() or probe.returncode}): "
                    "a network namespace with the loopback down needs root or CAP_SYS_ADMIN")
    return ["unshare", "-n"]


# What each errno that no_socket_env makes reads as in a message: its meaning and number.
SAID = {"EAFNOSUPPORT": "Address family not supported by protocol, errno 97",
        "EPERM": "Operation not permitted, errno 1"}


def python_json(tmp_path, errno_name: str, code: str):
    """What ``code`` (a Python program that prints one JSON value) prints where no TCP socket
    can be made (``errno_name``); asserts that it exits 0 (no traceback)."""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env=no_socket_env(tmp_path, errno_name), timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
