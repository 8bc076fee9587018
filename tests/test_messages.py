"""What a library said, translated into what was seen and what to do (issue 25, item 4)."""

from __future__ import annotations

import socket
import threading

import pytest
import yaml

from helpers import launch


@pytest.mark.slow
def test_a_host_that_accepts_tcp_and_never_speaks_ssh_is_named_as_such(tmp_path):
    # sshd past MaxStartups, a hung VM: TCP connects, no banner ever comes (paramiko #1038:
    # "SSHException: No existing session" was all the user saw)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.9", 0))
    server.listen(16)
    port = server.getsockname()[1]
    held = []
    threading.Thread(target=lambda: [held.append(server.accept()) for _ in range(16)],
                     daemon=True).start()
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({
        "backend": "ssh", "hosts": [{"host": "127.0.0.9", "port": port}], "user": "root",
        "connect_timeout_s": 2, "ssh_config_file": "/dev/null",
        "known_hosts_file": str(tmp_path / "known_hosts")}))
    try:
        done = launch("jobs/linear.yaml", "--cluster", str(cluster), "--dry-run", timeout_s=60)
    finally:
        server.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert (f"no SSH session: 127.0.0.9:{port} accepted the TCP connection but no SSH session "
            "started within 2 s") in done.stderr, done.stderr
    assert "MaxStartups" in done.stderr
