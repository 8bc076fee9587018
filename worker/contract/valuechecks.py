"""The checks of a setting's value (``setting(..., check=...)``): each returns None when the
value is fine, else the words "expected ..., got ..." that the launcher puts after the
setting's file, line and dotted key. Standard library only: the launcher and the worker
both read them (``worker.contract.sections``).
"""

from __future__ import annotations

import re
from typing import Any, Callable

Check = Callable[[Any], "str | None"]

# A check's ``allowed`` says in a few words what it lets through (the settings table of
# docs/settings.md shows it beside the type: launcher.commands.settings_doc).
# The largest number any setting may hold: a C int, what JAX's and numpy's
# int32 arguments, the OS's timers and PyYAML-free consumers all accept.
# Settings with tighter consumers say so (seeds: uint32).
NUMBER_MAX = 2**31 - 1
SEED_MAX = 2**32 - 1


def _too_big(value) -> str | None:
    if value > NUMBER_MAX:
        return (f"expected at most {NUMBER_MAX} (larger values overflow the int32 and timer "
                f"arguments it is passed to), got {value!r}")
    return None


def allows(text: str) -> Callable[[Check], Check]:
    """Mark a check with what it lets through, in words (``check.allowed``)."""
    def mark(check: Check) -> Check:
        check.allowed = text
        return check
    return mark


@allows("> 0")
def positive(value) -> str | None:
    return (None if value > 0 else f"expected a number > 0, got {value!r}") if value <= NUMBER_MAX \
        else _too_big(value)


@allows(">= 0")
def non_negative(value) -> str | None:
    return (None if value >= 0 else f"expected a number >= 0, got {value!r}") if value <= NUMBER_MAX \
        else _too_big(value)


@allows("> 0")
def positive_value(value) -> str | None:
    """> 0, any size: a value of the model's arithmetic (a float32 there), which no int32
    argument or timer receives."""
    return None if value > 0 else f"expected a number > 0, got {value!r}"


@allows(">= 0")
def non_negative_value(value) -> str | None:
    """>= 0, any size (as ``positive_value``)."""
    return None if value >= 0 else f"expected a number >= 0, got {value!r}"


@allows("0 to 2**32-1")
def seed(value) -> str | None:
    """A random seed: 0 to 2**32-1, what numpy's and JAX's 32-bit seeds take."""
    if 0 <= value <= SEED_MAX:
        return None
    return f"expected a seed from 0 to {SEED_MAX} (2**32-1), got {value!r}"


def index(value) -> str | None:
    """A (possibly negative) index into a row."""
    if -NUMBER_MAX <= value <= NUMBER_MAX:
        return None
    return f"expected an index from {-NUMBER_MAX} to {NUMBER_MAX}, got {value!r}"


def in_range(low, high) -> Check:
    @allows(f"{low:g} to {high:g}")
    def check(value):
        return None if low <= value <= high else f"expected {low} to {high}, got {value!r}"
    return check



def identifier(what: str, pattern: str, allowed: str, chars: str) -> Check:
    """A check that the whole string matches ``pattern`` (full match: a trailing newline fails).

    Values that reach a shell, a path, an ssh_config token or a remote command
    line are checked this strictly at load (OpenSSH refuses such host names
    too since 9.6, CVE-2023-51385). The message names the first character
    outside ``chars`` (a regex character class), or a leading '-' (it would
    read as an option).
    """
    compiled, allowed_char = re.compile(pattern), re.compile(chars)

    def check(value: str) -> str | None:
        if compiled.fullmatch(value):
            return None
        if not value:
            return f"expected {what}, got an empty string"
        at = 0 if value.startswith("-") else next(
            (i for i, c in enumerate(value) if not allowed_char.fullmatch(c)), None)
        where = f": {value[at]!r} at position {at} is not allowed" if at is not None else ""
        return f"expected {what} ({allowed}), got {value!r}{where}"
    return check



LOCAL_PATH = identifier("a file path", r"[^\x00-\x1f\x7f-][^\x00-\x1f\x7f]*",
                        "no control characters or line breaks, not starting with '-'",
                        r"[^\x00-\x1f\x7f]")
