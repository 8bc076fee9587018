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
import socket
import subprocess
import threading
import urllib.parse
import urllib.request
from typing import Callable

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


def _post(url: str, body: bytes, timeout_s: float) -> None:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "User-Agent": "podlaunch-notify"})
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # HTTPError: >= 400
        answer.read(65536)


def _run(argv: tuple, body: bytes, timeout_s: float) -> None:
    done = subprocess.run(list(argv), input=body, capture_output=True, timeout=timeout_s,
                          stdin=None)
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"exit code {done.returncode}" + (f": {last[0][:200]}" if last[0] else ""))


def sender(spec, job: str, run_dir: str, say: Callable[[str], None]) -> Callable | None:
    """The notifier of a run (``spec``: its ``NotifySpec``), or None where it names none.

    Returns:
      ``send(event, record)``: ``record`` is run.json's content; says in ``say`` (the console
      and launcher.log) whom it told, or why not.
    """
    if spec.webhook is None and not spec.command:
        return None
    targets = []
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
                why = getattr(failed[0], "reason", None) or failed[0]
                say(f"notify: {what} failed ({type(failed[0]).__name__}: {why}); the run's "
                    "outcome stands")
            else:
                say(f"notify: {what} told ({event}: {record.get('state')})")

    return send
