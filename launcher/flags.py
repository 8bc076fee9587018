"""The numeric command-line flags' checks: every command checks its flags here before it asks,
starts or serves anything, and names each bad one in a sentence (exit 2).

argparse turns ``--timeout-s nan`` or ``-5`` into a float without a word; a wait of NaN
seconds ends at once, one of -5 asks and then says "did not answer within -5 s".
"""

from __future__ import annotations

import math

from launcher.errors import Problem, SpecError

PORT_MAX = 65535


def seconds(value: float) -> str | None:
    """A wait: a finite number of seconds > 0."""
    if math.isfinite(value) and value > 0:
        return None
    return f"expected a number of seconds > 0, got {value:g}"


def seconds_or_never(value: float) -> str | None:
    """A period: a finite number of seconds >= 0 (0: never)."""
    if math.isfinite(value) and value >= 0:
        return None
    return f"expected a number of seconds >= 0 (0 = never), got {value:g}"


def port(value: int) -> str | None:
    """A TCP port, or 0 for a free one."""
    return None if 0 <= value <= PORT_MAX else f"expected a port from 1 to {PORT_MAX} (0: a free one), got {value}"


def check(*flags: tuple) -> None:
    """Check each ``(flag, value, check, what it is for)``.

    Raises:
      SpecError: one problem per bad flag (what was seen, what was expected, what it is for).
    """
    problems = [Problem(flag, None, "", f"{why}: {meaning}")
                for flag, value, test, meaning in flags if (why := test(value))]
    if problems:
        raise SpecError(problems)
