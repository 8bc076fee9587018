"""The job a run was started with, ``RUN_DIR/job.recorded.json``: the text of its spec file
(and of its ``--cluster`` file) as read at the run's start, so that taking the run back
(``launch attach`` of a detached run whose supervisor was killed), its restarts after that,
``launch stop`` and ``--resume`` run the recorded job, not the file as it is now (an edited
or deleted ``job.yaml``: the take-back ran the edited program).

Keys: ``version``; ``job_path`` (absolute: a relative ``data.path`` in it is relative to the
file's folder, as at the start); ``cluster_path`` (absolute, or null); ``texts``, each file's
text by that path. Mode 0600 (a spec may hold secrets), read only as the user's own regular
file of the user's own run directory (``worker.contract.runfiles``), as the journal is.

A spec changed since the start is said by the command that finds it (``changes``), and
applied by ``--resume`` only when asked (``--apply-changes``, which records the files as
they are then). A run started before this file existed has none: its files are read as
they are.
"""

from __future__ import annotations

import dataclasses
import json
import os

from launcher.errors import Problem, SpecError
from launcher.rundir import specdiff
from worker.contract import runfiles

FILE = "job.recorded.json"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class Recorded:
    """The spec files of a run as read at its start.

    Attributes:
      job_path: the job file's absolute path then.
      cluster_path: the ``--cluster`` file's, or None.
      texts: each file's text by its path (``launcher.spec.load``'s ``texts``).
    """

    job_path: str
    cluster_path: str | None
    texts: dict

    @classmethod
    def of(cls, job_path: str, cluster_path: str | None, texts: dict) -> "Recorded":
        """What ``launcher.spec.load`` read (``texts``: its record of the paths given)."""
        mine = {os.path.abspath(p): t for p, t in texts.items() if p in (job_path, cluster_path)}
        return cls(os.path.abspath(job_path),
                   None if cluster_path is None else os.path.abspath(cluster_path), mine)


def write(run_dir: str, recorded: Recorded) -> None:
    """Record ``recorded`` (0600, written whole).

    Raises:
      OSError: it cannot be written.
    """
    runfiles.write_whole(os.path.join(run_dir, FILE), json.dumps(
        {"version": VERSION, **dataclasses.asdict(recorded)}) + "\n")


def read(run_dir: str) -> Recorded | None:
    """The job recorded at the run's start; None where the run has none (started before it
    was kept).

    Raises:
      SpecError: it cannot be read, is not the user's own, or is not such a record (nothing
        is run from it).
    """
    path = os.path.join(run_dir, FILE)
    try:
        data = json.loads(runfiles.read_regular(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not JSON"
        raise SpecError([Problem("RUN", None, "", (
            f"cannot read the job the run was started with ({path}: {why}); nothing was "
            "started from it"))]) from None
    texts = data.get("texts") if isinstance(data, dict) else None
    paths = [data.get("job_path")] + ([data["cluster_path"]] if isinstance(data, dict) and
                                      data.get("cluster_path") is not None else [])
    if not isinstance(texts, dict) or data.get("version") != VERSION or not all(
            isinstance(p, str) and os.path.isabs(p) and isinstance(texts.get(p), str)
            for p in paths):
        raise SpecError([Problem("RUN", None, "", (
            f"{path} is not the record of a run's job (version {VERSION}: job_path, "
            "cluster_path, texts); nothing was started from it"))])
    return Recorded(paths[0], data.get("cluster_path"), {p: texts[p] for p in paths})


def changes(recorded_job, now_job) -> list:
    """``key: before -> now`` for every setting in which the job as its files are now
    (``now_job``) differs from the recorded one, secrets masked (a changed secret is said
    as changed, never shown)."""
    before, after = (specdiff.flat(job.to_dict()) for job in (recorded_job, now_job))
    shown_before, shown_after = (specdiff.flat(job.to_masked_dict())
                                 for job in (recorded_job, now_job))
    return [f"{key}: {shown_before.get(key, '(unset)')!r} -> {shown_after.get(key, '(unset)')!r}"
            for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]
