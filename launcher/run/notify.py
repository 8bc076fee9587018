"""A word when a run ends (``notify:`` in the spec, ``launcher.spec.notifyspec``): a webhook that
gets a JSON POST and/or a command that gets the same JSON on stdin, as SkyPilot's and
OLMo-core's users ask for (a run of days ends or dies while nobody looks).

``sender`` makes the callable that ``launcher.rundir.record.Record`` calls when the run ends
(``end``) and, with ``notify.on_restart``, when an attempt after the first is under way
(``restart``). Each notification runs in a thread of its own, waited on for
``notify.timeout_s`` (and a second): a webhook that hangs (its DNS included) or a command
that never ends is given up and said, and nothing a notifier does changes the run's outcome or
exit code. The webhook's URL is a credential: it is shown as ``scheme://host/****``.

The JSON object (one per notification): ``event`` (``end`` or ``restart``), ``job``,
``run_dir``, ``host`` (the supervisor's), ``state`` (succeeded, failed, diverged, interrupted;
running for a restart), ``attempts``, ``step``, ``num_steps``, ``final_loss``, ``goodput``,
``duration_s`` (seconds), ``last_failure`` (``attempt``, ``class``, ``process_id``, ``why``)
or null.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable

from launcher import owned
from worker.contract import redact

FIELDS = ("state", "attempts", "step", "num_steps", "final_loss", "goodput", "duration_s",
          "last_failure")


def shown_url(url: str) -> str:
    """A webhook's URL as it may be printed: its scheme and host, the rest masked."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}/****"


def payload(event: str, job: str, run_dir: str, record: dict) -> dict:
    """The JSON object of one notification (the module's docstring lists its keys)."""
    return {"event": event, "job": job, "run_dir": run_dir, "host": socket.gethostname(),
            **{key: record.get(key) for key in FIELDS}}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A webhook's redirect is not followed: urllib would send a GET without the payload to
    wherever it points (another host too); the answer stays the ``HTTPError`` it is."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _post(url: str, body: bytes, timeout_s: float) -> None:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "User-Agent": "podlaunch-notify"})
    try:
        with _OPENER.open(request, timeout=timeout_s) as answer:  # HTTPError: >= 300
            answer.read(65536)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            raise Failed(f"it answered {exc.code} {exc.reason}, a redirect, which is not "
                         "followed (the payload would not go with it): give the URL it "
                         "redirects to") from None
        raise Failed(f"it answered {exc.code} {exc.reason}") from None


class Failed(Exception):
    """A notifier failed; the message is podlaunch's (masked where it is said)."""


TAIL_BYTES = 4096  # of a command's output, kept for the reason it failed: never all of it


def _tail(stream, kept: bytearray) -> None:
    """Read ``stream`` to its end, keeping its last ``TAIL_BYTES`` in ``kept``."""
    while True:
        chunk = stream.read(65536)
        if not chunk:
            return
        kept += chunk
        del kept[:-TAIL_BYTES]


def _run(argv: tuple, body: bytes, timeout_s: float) -> None:
    """Run the notify command in a process group of its own, the JSON on its stdin, its output
    read to its last ``TAIL_BYTES`` only; once it ends (or at ``timeout_s``) what is left of its
    group is killed: a background child neither outlives it nor keeps it counted as running.
    It gets the supervisor's environment but the run's proof (``owned.SECRET_VAR``): nothing
    it starts can pass for one of the run's processes."""
    env = {k: v for k, v in os.environ.items() if k not in (owned.SECRET_VAR, owned.RUN_DIR_VAR)}
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
    except OSError as exc:
        raise Failed(f"it cannot be started: {exc.strerror}") from None
    kept = bytearray()
    reader = threading.Thread(target=_tail, args=(proc.stdout, kept), daemon=True)
    reader.start()
    try:
        try:
            proc.stdin.write(body)
            proc.stdin.close()
        except OSError:  # it did not read its stdin: its exit code says how it went
            pass
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise Failed(f"it did not end within notify.timeout_s ({timeout_s:g} s): it was "
                         "stopped, with every process it started") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:  # its group is gone already
            pass
        proc.wait()
        reader.join(1.0)
    if code != 0:
        lines = bytes(kept).decode(errors="replace").strip().splitlines()[-1:] or [""]
        ended = (f"killed by {signal.Signals(-code).name}" if -code in signal.valid_signals()
                 else f"exit code {code}")
        raise Failed(ended + (f": {lines[0][:200]}" if lines[0] else ""))


def sender(spec, job: str, run_dir: str, say: Callable[[str], None]) -> Callable | None:
    """The notifier of a run (``spec``: its ``NotifySpec``), or None where it names none.

    Returns:
      ``send(event, record)``: ``record`` is run.json's content; says in ``say`` (the console
      and launcher.log) whom it told, or why not.
    """
    if spec.webhook is None and not spec.command:
        return None
    targets = []

    def masked(text: str) -> str:  # a library's words may quote the URL or the command line
        if spec.webhook:
            parts = urllib.parse.urlsplit(spec.webhook)
            for secret in (spec.webhook, parts.path, parts.query):
                if len(secret) > 1:
                    text = text.replace(secret, "/****")
        for item in spec.command:
            if len(item) > 3 and item not in redact.masked_argv(spec.command):
                text = text.replace(item, redact.MASK)
        return redact.mask_text(text)

    if spec.webhook is not None:
        targets.append((f"webhook {shown_url(spec.webhook)}",
                        lambda body: _post(spec.webhook, body, spec.timeout_s)))
    if spec.command:
        targets.append((f"command {spec.command[0]}",
                        lambda body: _run(spec.command, body, spec.timeout_s)))

    def send(event: str, record: dict) -> None:
        if event == "restart" and not spec.on_restart:
            return
        body = json.dumps(payload(event, job, run_dir, record)).encode()
        if event == "restart":  # supervision goes on meanwhile; the end waits for its word
            threading.Thread(target=tell, args=(event, record, body), daemon=True).start()
        else:
            tell(event, record, body)

    def tell(event: str, record: dict, body: bytes) -> None:
        for what, call in targets:
            failed: list = []

            def attempt(call=call, failed=failed):
                try:
                    call(body)
                except BaseException as exc:  # noqa: BLE001: a notifier never ends the run
                    failed.append(exc)

            thread = threading.Thread(target=attempt, name="podlaunch-notify", daemon=True)
            thread.start()
            thread.join(spec.timeout_s + 1.0)
            if thread.is_alive():
                say(f"notify: {what} did not answer within notify.timeout_s ({spec.timeout_s:g} "
                    "s); given up (the run's outcome stands)")
            elif failed:
                exc = failed[0]
                why = str(exc) if isinstance(exc, Failed) else \
                    f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}"
                say(f"notify: {what} failed ({masked(why)}); the run's outcome stands")
            else:
                say(f"notify: {what} told ({event}: {record.get('state')})")

    return send
