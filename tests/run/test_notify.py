"""``notify:``: a word when a run ends, to a real HTTP server on loopback and to a command; a
webhook that never answers neither hangs nor fails the run; the webhook's URL (a credential)
is masked wherever it is printed or kept. Real launcher, real JAX workers."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from harness.helpers import launch

pytestmark = pytest.mark.slow  # real workers

SHORT = ("jobs/linear.yaml", "--set", "train.num_steps=5", "--set", "cluster.num_processes=1")
TOKEN = "T0KEN-in-the-path"


class _Hook(http.server.BaseHTTPRequestHandler):
    got: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.got.append((self.path, self.headers["Content-Type"], json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hook():
    _Hook.got = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hooks/{TOKEN}", _Hook.got
    server.shutdown()
    server.server_close()


def test_a_run_that_ends_tells_the_webhook_and_the_command_once_with_its_state(tmp_path, hook):
    url, got = hook
    told = tmp_path / "told.json"
    run_dir = tmp_path / "run"
    done = launch(*SHORT, "--set", f"notify.webhook={url}", "--set",
                  f"notify.command=[sh, -c, 'cat > {told}']", "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(got) == 1, got
    path, kind, body = got[0]
    assert path == f"/hooks/{TOKEN}" and kind == "application/json"
    assert body["event"] == "end" and body["state"] == "succeeded" and body["job"] == "linear"
    assert body["step"] == 5 and body["num_steps"] == 5 and body["run_dir"] == str(run_dir)
    assert body["last_failure"] is None and isinstance(body["goodput"], float)
    assert json.loads(told.read_text()) == body
    assert "notify: webhook http://127.0.0.1/**** told (end: succeeded)" in done.stdout
    assert "notify: command sh told (end: succeeded)" in done.stdout
    for text in (done.stdout, done.stderr, (run_dir / "spec.yaml").read_text(),
                 (run_dir / "launcher.log").read_text()):
        assert TOKEN not in text


def test_a_failed_run_says_why_and_a_webhook_that_never_answers_changes_nothing(tmp_path, hook):
    url, got = hook
    done = launch(*SHORT, "--set", "train.num_steps=20", "--set", "optimizer.learning_rate=1000",
                  "--set", f"notify.webhook={url}",
                  "--run-dir", str(tmp_path / "failed"))
    assert done.returncode == 1, done.stdout + done.stderr
    [(_, _, body)] = got
    assert body["state"] == "failed" and body["last_failure"]["class"] == "program error"
    assert "loss is inf" in body["last_failure"]["why"]
    silent = socket.socket()  # accepts into its backlog, never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        began = time.monotonic()
        done = launch(*SHORT, "--set", f"notify.webhook=http://127.0.0.1:{silent.getsockname()[1]}/x",
                      "--set", "notify.timeout_s=1", "--run-dir", str(tmp_path / "silent"))
        took = time.monotonic() - began
    finally:
        silent.close()
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("notify: webhook http://127.0.0.1/**** failed (TimeoutError" in done.stdout
            or "did not answer within notify.timeout_s (1 s)" in done.stdout), done.stdout
    assert took < 60
    refused = launch(*SHORT, "--set", "notify.webhook=ftp://x/y", "--run-dir", str(tmp_path / "bad"))
    assert refused.returncode == 2 and "notify.webhook: expected an http:// or https:// URL" in \
        refused.stderr
