"""What a library said, translated into what was seen and what to do (issue 25, item 4)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import yaml

from harness.helpers import launch


@pytest.mark.slow
def test_a_host_that_accepts_tcp_and_never_speaks_ssh_is_named_as_such(tmp_path):
    """sshd past MaxStartups, a hung VM: TCP connects, no banner ever comes (paramiko #1038:
    "SSHException: No existing session" was all the user saw). Issue 71: such a host was
    refused after paramiko's own 15 s banner wait with ``connect_timeout_s: 40``, the message
    saying "within 40 s"; the setting is every wait of the connection. The silent server
    times how long the launcher waited before it hung up: the setting (17 s), not 15."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.9", 0))
    server.listen(4)
    port = server.getsockname()[1]
    waited = []

    def silent():
        conn, _ = server.accept()
        began = time.monotonic()
        try:
            while conn.recv(4096):  # the client's banner; then nothing until it hangs up
                pass
        except OSError:
            pass
        waited.append(time.monotonic() - began)
        conn.close()

    threading.Thread(target=silent, daemon=True).start()
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({
        "backend": "ssh", "hosts": [{"host": "127.0.0.9", "port": port}], "user": "root",
        "connect_timeout_s": 17, "ssh_config_file": "/dev/null",
        "known_hosts_file": str(tmp_path / "known_hosts")}))
    try:
        done = launch("jobs/linear.yaml", "--cluster", str(cluster), "--dry-run", timeout_s=90)
    finally:
        server.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert (f"no SSH session: 127.0.0.9:{port} accepted the TCP connection but no SSH session "
            "started within 17 s") in done.stderr, done.stderr
    assert "MaxStartups" in done.stderr
    assert waited and waited[0] >= 16.5, waited


# Texts as jax 0.9 / jaxlib 0.9 printed them in this project's runs (a peer SIGKILLed
# mid-all-reduce; the coordinator gone), and what the summary must add under them.
GLOO_PEER_GONE = ("jax.errors.JaxRuntimeError: UNKNOWN: Buffer Definition Event: Gloo all-reduce "
                  "failed: [external/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by "
                  "peer [127.0.0.1]:8615")
COORDINATOR_GONE = ("E1201 15:26:47.016582   30256 coordination_service_agent.cc:286] Polled an "
                    "error from coordination service (this can be an error from this or another "
                    "task).")


@pytest.mark.parametrize("line, said", [
    (GLOO_PEER_GONE, "was cut off from another process: that process died"),
    (COORDINATOR_GONE, "JAX's coordination service (run by process 0) went away"),
    ("W1201 15:26:47.015731   30256 preemption_sync_manager.cc:149] Failed to retrieve "
     "preemption notice from coordination service: UNAVAILABLE: Socket closed",
     "JAX's coordination service"),
    ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
     "allocate 17179869184 bytes.", "a device ran out of memory: lower train.global_batch_size"),
    ("OSError: [Errno 98] Address already in use", "a port the job needs is taken"),
    # jax 0.9 without libtpu (a tester's run): not the TPU in use, which it was read as
    ("RuntimeError: Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so: "
     "libtpu.so: cannot open shared object file: No such file or directory (set "
     "JAX_PLATFORMS='' to automatically choose an available backend)",
     "libtpu, the TPU's runtime, is not installed"),
    ("RuntimeError: Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by "
     "process with pid 1234. Not attempting to load libtpu.so in this process.",
     "another process holds this host's TPU"),
    ("step 7/10 loss 0.5", None),
])
def test_library_texts_in_a_failed_tail_get_their_meaning(line, said):
    from launcher.console import explain

    got = explain.meaning(["step 6/10 loss 0.5", line])
    assert (got is None) if said is None else (said in got), got


def test_the_summary_says_what_each_failed_process_s_library_text_means():
    from launcher.console import status
    from launcher.ends import Exited, Killed
    from launcher.state import Result, State, Tracked

    def tracked(process_id, state, ended, tail):
        plan = type("P", (), {"process_id": process_id, "host": "h%d" % process_id,
                              "log_path": "/r/logs/process-%03d.log" % process_id,
                              "label": "p%d" % process_id})()
        t = Tracked(worker=type("W", (), {"plan": plan})(), state=state, exit=ended)
        t.tail.extend(tail)
        return t

    first = tracked(1, State.FAILED, Killed(9), ["faulty_task: injecting sigkill at step 300"])
    peer = tracked(0, State.FAILED, Exited(1), ["Traceback (most recent call last):", GLOO_PEER_GONE])
    stopped = tracked(2, State.STOPPED, Exited(143), [COORDINATOR_GONE])
    text = status.summary(Result([peer, first, stopped], first, False, 3.0))
    assert ("p0 on h0 (exit code 1): a collective (gloo, JAX's CPU all-reduce) was cut off "
            "from another process") in text, text
    assert "p2 on h2" not in text  # stopped by the launcher, not a failure of its own
    assert "what it usually means" not in text  # a SIGKILL's tail says nothing to read


@pytest.mark.parametrize("text, line, hint", [
    ("name: t\ncmd: a: b\n", 2, "usually a ': ' inside a value: quote the value"),
    ("name: t\ntrain:\n\tnum_steps: 1\n", 3, "usually a tab: YAML indents with spaces only"),
    ("name: t\ntrain:\n  num_steps: 1\n global_batch_size: 2\n", 4,
     "usually a line indented unlike its siblings"),
    ("name: t\nx: *nothing\n", 2, "a *name with no &name anchor earlier in the file"),
    ("name: t\nx: 'open\n", 3, "usually a quote or bracket opened and never closed"),
    ("name: t\nxs: [1, 2\n", 3, "usually a [ list never closed"),
])
def test_yaml_slips_name_their_line_and_what_usually_causes_them(tmp_path, text, line, hint):
    path = tmp_path / "slip.yaml"
    path.write_text(text)
    done = launch(str(path), "--dry-run")
    assert done.returncode == 2, done.stdout + done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"error: {path}:{line}: not valid YAML: ") and hint in first, first
    assert "Traceback" not in done.stderr


def test_no_message_counts_with_a_fixed_plural():
    """issue 29: "preflight ok on 1 hosts". A count of things the run has (hosts, files,
    checkpoints, processes) goes through ``launcher.words.plural``: no f-string in the
    launcher puts a ``len(...)`` or a counted variable before a fixed plural noun."""
    import glob
    import os
    import re

    from harness.helpers import REPO

    fixed = re.compile(r"\{(?:len\([^{}]*\)|count|copied|n|[\w.]*num_\w+|[\w.]*_count|[\w.]*_per_\w+)\} (?!of\b)"
                       r"(?:[a-z]+s\b|[\w ]+\(s\))"
                       # any count before "times" or "steps": "failed 1 times", "1 steps"
                       r"|\{[^{}:]*\}\s*(?:\"\s*f?\")?\s*(?:times|steps)\b(?! ?/)")
    found = []
    for path in glob.glob(os.path.join(REPO, "launcher", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if fixed.search(line) and " == 1 else " not in line:  # one written apart
                    found.append(f"{os.path.relpath(path, REPO)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
