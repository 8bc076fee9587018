"""The Python and JAX versions podlaunch is tested with, and a warning for hosts outside them.

CI runs the whole suite at the oldest end (``.ci/run``: Python ``TESTED_PYTHON[0]`` with
jax/jaxlib ``TESTED_JAX[0]``) and the fast tests plus a real multi-process run and an sshd
run at the newest end (``.ci/newest_end.sh``: Python ``TESTED_PYTHON[1]`` with jax/jaxlib
``TESTED_JAX[1]``). Both scripts read the pins from here, so this file and pyproject.toml's
``requires-python`` and ``jax``/``jaxlib`` ranges are the only places to change.

Why the ends are where they are:
  - JAX 0.9.0: the oldest release where every test passes. 0.6.x lacks
    ``jax.distributed.initialize(heartbeat_timeout_seconds=...)`` (the worker fails at
    start-up); 0.7.0 to 0.8.3 train correctly, but each process's own step time includes
    waiting for its peers (seen on CPU with gloo), so the per-process step-time curves and
    the status line cannot tell which process is slow.
  - Python 3.11: jax 0.7 and later publish no wheels for Python 3.10, so on 3.10 no
    supported jax installs.
  - JAX 0.12.0.1 on Python 3.13: the newest release of each when this was written
    (jax 0.11 and later need Python 3.12 or newer).

Stdlib only and no imports from the rest of podlaunch: the launcher and CI's shell
scripts (through ``runpy``) read it without installing anything.
"""

from __future__ import annotations

import re

# Inclusive ends; what CI installs. Python by minor version.
TESTED_PYTHON = ("3.11", "3.13")
TESTED_JAX = ("0.9.0", "0.12.0.1")


def parse_version(text) -> tuple[int, ...] | None:
    """The release numbers at the start of a version string, or None if there are none.

    ``"0.12.0.1"`` -> ``(0, 12, 0, 1)``; ``"3.11.7+"`` -> ``(3, 11, 7)``;
    ``"0.10.2.dev20260101"`` and ``"0.13.0rc1"`` -> their release numbers
    (``(0, 10, 2)``, ``(0, 13, 0)``); ``"1!2.0"`` (an epoch) -> None.
    Trailing zeros do not count: ``"0.9"`` and ``"0.9.0"`` compare equal.
    """
    if not isinstance(text, str):
        return None
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)(?![\d!])", text)
    if not match:
        return None
    parts = [int(p) for p in match.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _where(version: tuple, low: tuple, high: tuple) -> str | None:
    if version < low:
        return "older"
    if version > high:
        return "newer"
    return None


def outside_tested(jax_version, python_version=None) -> str | None:
    """A warning when a host's jax (and, if given, Python) lies outside the tested range.

    Args:
      jax_version: the host's jax version string, e.g. ``"0.10.2"`` (jaxlib must be the
        same; preflight refuses hosts where they differ). None (not installed) gives no
        warning here: preflight refuses such hosts already.
      python_version: e.g. ``"3.11.7"``; compared by major.minor.

    Returns:
      One line without a trailing newline (the caller names the host or hosts), or None
      when everything given is within the tested range.
    """
    problems = []
    low, high = TESTED_JAX
    if jax_version is not None:
        got = parse_version(jax_version)
        side = None if got is None else _where(got, parse_version(low), parse_version(high))
        if got is None:
            problems.append(f"jax version {jax_version!r} is not a version number podlaunch "
                            f"can compare (tested: jax {low} to {high})")
        elif side == "older":
            problems.append(f"jax {jax_version} is older than podlaunch's tested range (jax "
                            f"{low} to {high}): per-process step times and the slowest-process "
                            f"report may be wrong, or the worker may not start; install jax and "
                            f"jaxlib {low} or newer on every host")
        elif side == "newer":
            problems.append(f"jax {jax_version} is newer than podlaunch's tested range (jax "
                            f"{low} to {high}): it may well work; if it does not, install jax "
                            f"and jaxlib {high} on every host")
    if python_version is not None:
        py_low, py_high = TESTED_PYTHON
        got = parse_version(python_version)
        if got is not None:
            side = _where(got[:2], parse_version(py_low)[:2], parse_version(py_high)[:2])
            if side:
                problems.append(f"Python {python_version} is {side} than podlaunch's tested "
                                f"range (Python {py_low} to {py_high})")
    return "; ".join(problems) or None
