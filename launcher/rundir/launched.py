"""``<run dir>/launch.json``: what the run was launched from, so that ``launch resume RUN``
(or ``launch --resume RUN`` alone) continues it from any directory with the same job and
settings, a new ``--set`` on top.

Its keys::

    job        the job file, an absolute path
    cluster    the ``--cluster`` file, an absolute path, or null
    overrides  every ``--set KEY=VALUE`` in order, the run's first launch's and each resume's
               new ones after them

Written when the launch claims its run directory (a fresh run, and every resume: a resume
given its job in full, ``launch JOB.yaml --set ... --resume RUN``, replaces what was
recorded). A ``--set`` may hold a secret in clear, as ``job.json`` does: the file is mode
0600 in the user's own run directory, never read through a link nor when another user's or
writable by others (``worker.contract.runfiles``).
"""

from __future__ import annotations

import dataclasses
import json
import os

from launcher.errors import Problem, SpecError
from worker.contract import runfiles

LAUNCH_FILE = "launch.json"


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a launch was given: ``job`` and ``cluster`` (absolute paths; ``cluster`` None
    without ``--cluster``) and its ``--set`` overrides in order."""

    job: str
    cluster: str | None
    overrides: tuple

    @classmethod
    def given(cls, job: str, cluster: str | None, overrides) -> "Inputs":
        """The inputs as typed (paths relative to the current directory made absolute)."""
        return cls(os.path.abspath(job), os.path.abspath(cluster) if cluster else None,
                   tuple(overrides))

    def argv(self) -> list:
        """``JOB [--cluster FILE] [--set KV ...]``, as ``launch`` takes them."""
        return [self.job, *(["--cluster", self.cluster] if self.cluster else []),
                *[part for kv in self.overrides for part in ("--set", kv)]]


def write(run_dir: str, inputs: Inputs) -> None:
    """Record ``inputs`` as what the run in ``run_dir`` continues from.

    Raises:
      OSError: it cannot be written.
    """
    runfiles.write_whole(os.path.join(run_dir, LAUNCH_FILE), json.dumps(
        {"job": inputs.job, "cluster": inputs.cluster, "overrides": list(inputs.overrides)},
        indent=1) + "\n", mode=0o600)


def read(run_dir: str, flag: str = "RUN") -> Inputs:
    """What the run in ``run_dir`` was launched from.

    Raises:
      SpecError: none recorded (a run from before podlaunch kept it), or a file that is not one
        (a link, another user's, not of its form): said with the command to give instead.
    """
    path = os.path.join(run_dir, LAUNCH_FILE)
    instead = f"give the job as well: launch JOB.yaml [--set KEY=VALUE ...] --resume {run_dir}"
    try:
        data = json.loads(runfiles.read_regular(path, limit=1 << 20))
    except FileNotFoundError:
        raise SpecError([Problem(flag, None, "", f"{run_dir} does not say what it was launched "
                                 f"from (no {LAUNCH_FILE}: a run from an older podlaunch); "
                                 + instead)]) from None
    except (OSError, ValueError, RecursionError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not JSON"
        raise SpecError([Problem(flag, None, "", f"cannot read {path} ({why}); {instead}")]) \
            from None
    job = data.get("job") if isinstance(data, dict) else None
    cluster = data.get("cluster") if isinstance(data, dict) else None
    overrides = data.get("overrides") if isinstance(data, dict) else None
    if not (isinstance(job, str) and os.path.isabs(job)
            and (cluster is None or (isinstance(cluster, str) and os.path.isabs(cluster)))
            and isinstance(overrides, list) and all(isinstance(o, str) for o in overrides)):
        raise SpecError([Problem(flag, None, "", f"{path} is not what podlaunch writes there "
                                 f"(job, cluster, overrides); {instead}")])
    return Inputs(job, cluster, tuple(overrides))
