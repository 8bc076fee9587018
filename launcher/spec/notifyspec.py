"""The ``notify:`` section of a job spec: a word when a run ends (``launcher.run.notify``)."""

from __future__ import annotations

import dataclasses
import re
import urllib.parse

from worker.contract.sections import setting
from worker.contract.valuechecks import positive


def _webhook(value: str | None) -> str | None:
    """The URL checked whole, as the HTTP client will take it; what is wrong is said without
    the URL (a credential)."""
    if value is None:
        return None
    expected = "expected an http:// or https:// URL (a Slack, Teams or any webhook that takes a JSON POST)"
    if not re.match(r"https?://[^\s/]+", value):
        return expected
    odd = re.search(r"[\x00-\x20\x7f]", value)
    if odd:
        what = "a space" if odd.group() == " " else f"control character {odd.group()!r}"
        return (f"{expected}; this one holds {what} at character {odd.start() + 1} of "
                f"{len(value)}: write a space as %20, and check it was pasted whole")
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 (a port that is not a number raises)
    except ValueError:  # urllib's words would quote the URL
        return f"{expected}; this one's host or port cannot be read (a port is a number)"
    if not parts.hostname:
        return f"{expected}; this one names no host"
    return None


def _command(value: tuple) -> str | None:
    if value and not value[0].strip():
        return "argv[0] is empty; name the command, e.g. [mail, -s, run ended, me@example.com]"
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class NotifySpec:
    """``notify``: a word when a run ends (``launcher.run.notify``): a webhook and/or a
    command, each given one JSON object; neither can change the run's outcome."""

    webhook: str | None = setting(None, check=_webhook,
                                  doc="a URL that gets a JSON POST when the run ends (succeeded, "
                                  "failed, diverged, interrupted): run_dir, job, state, step, "
                                  "num_steps, goodput, last_failure; masked wherever printed "
                                  "(it is a credential); null: none")
    command: tuple[str, ...] = setting((), check=_command,
                                       doc="a command run when the run ends, the same JSON on "
                                       "its stdin (no shell: a list, e.g. [sh, notify.sh]); "
                                       "[]: none")
    on_restart: bool = setting(False, doc="also notify when an attempt failed and the run "
                               "restarts (event: restart)")
    timeout_s: float = setting(10.0, check=positive,
                               doc="how long one notification may take; a slower or failed one "
                               "is said in launcher.log and given up")
