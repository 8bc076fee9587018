"""The profiling wire between the launcher and the workers: the request ``launch profile``
writes into each process's run directory (``STEPS_FILE``), the line a process prints when its
trace is written (``LINE_FORMAT``, read back by ``parse``) and where traces go, laid out for
TensorBoard's profile plugin (``PLUGIN_DIR``, ``trace_path``). The tracing itself is
``worker.telemetry.profiler``.
"""

from __future__ import annotations

import dataclasses
import os
import re

from worker.contract import runfiles

PLUGIN_DIR = os.path.join("tensorboard", "plugins", "profile")  # under the run directory
STEPS_FILE = "profile-steps.json"  # the launcher's request, in each process's run directory

LINE_FORMAT = ("profile of steps {first}-{last} ({session}): {seconds:.3f} s traced, "
               "{ms_per_step:.2f} ms per step: {kept}")
SESSION_RE = re.compile(r"\w[\w.-]{0,79}")  # a session's name: a directory's, short
LINE_RE = re.compile(rf"^profile of steps (?P<first>\d+)-(?P<last>\d+) \((?P<session>{SESSION_RE.pattern})\): "
                     r"(?P<seconds>[0-9.]+) s traced, (?P<ms>[0-9.]+) ms per step: (?P<kept>.*)$")
NOT_KEPT = "not kept"  # how a ``slowest`` process that was not the slowest ends its line


@dataclasses.dataclass(frozen=True)
class Trace:
    """One process's ``LINE_FORMAT`` line.

    Attributes:
      first, last: the steps traced (inclusive).
      session: the profile plugin's session (``steps_20-25``).
      seconds: wall time of the traced steps; ms_per_step: the same per step, in ms.
      path: the trace, relative to the run directory; None when not kept (``slowest``).
    """

    first: int
    last: int
    session: str
    seconds: float
    ms_per_step: float
    path: str | None


def parse(line: str) -> Trace | None:
    """The ``Trace`` a worker's profile line reports, or None for any other line."""
    found = LINE_RE.match(line)
    if found is None:
        return None
    kept = found["kept"]
    return Trace(int(found["first"]), int(found["last"]), found["session"], float(found["seconds"]),
                 float(found["ms"]), None if kept.startswith(NOT_KEPT) else kept)


def write_request(run_dir: str, text: str) -> None:
    """Write ``text`` as ``STEPS_FILE`` in ``run_dir`` whole (``runfiles.write_whole``: never
    through a link), so a process polling it never reads half of it (the launcher's side, on
    this machine or a shared filesystem).

    Raises:
      OSError: it cannot be written.
    """
    runfiles.write_whole(os.path.join(run_dir, STEPS_FILE), text + "\n", mode=0o644)


def session_name(first: int, last: int) -> str:
    """The profile plugin's session (its "run") of a window of steps: ``steps_20-25``."""
    return f"steps_{first}-{last}"


def trace_path(run_dir: str, session: str, process_id: int) -> str:
    """Where ``process_id``'s trace of ``session`` goes (relative paths stay relative)."""
    return os.path.join(run_dir, PLUGIN_DIR, session, f"process_{process_id}.xplane.pb")
