"""Which queued jobs and steps of a job are another live launch's, and which are stale.

A sweep launches one job several times side by side (submitit #1624): every launch's
Slurm job has the same name, so a name says nothing of staleness. Stale means its
launcher is gone, and the launcher says so itself: it holds its run directory's lock
(``launcher.rundir.runlock``) for as long as it lives, and the kernel drops the lock
however it ends (SIGKILL included). A batch job names its run directory through its
output file (``RUN_DIR/slurm/batch-%j.out``); a step names it through its tag
(``<job name>.<tag>.p<id>``, the tag mapped back by a file under
``~/.podlaunch/slurm-runs/``, the home directory being shared on a cluster). A job or
step whose run directory cannot be found is taken as stale, as before this check:
refused, and cancelled only with ``--kill-stale``.
"""

from __future__ import annotations

import hashlib
import os

from launcher import owned
from launcher.backends.slurm import lifecycle
from launcher.backends.slurm.lifecycle import Phase
from launcher.errors import SpecError
from launcher.rundir import runlock


def run_tag(run_dir: str) -> str:
    """A short, stable name of a run directory, for its step names (``register_run`` maps it back)."""
    return hashlib.sha1(os.path.realpath(run_dir).encode()).hexdigest()[:10]


def registry_path(tag: str) -> str:
    return os.path.join(os.path.expanduser("~"), ".podlaunch", "slurm-runs", tag)


def register_run(run_dir: str) -> None:
    """Record which run directory a step tag names (the home directory is shared on a cluster)."""
    path = registry_path(run_tag(run_dir))
    try:  # a folder and file of the user's own only (``owned.state_folder``): none is followed
        if owned.state_folder(True, "cluster.backend", os.path.dirname(path), "step tags") is None:
            return
        with open(owned.open_state_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                                        "cluster.backend"), "w", encoding="utf-8") as f:
            f.write(os.path.realpath(run_dir))
    except (OSError, SpecError):
        pass  # then its steps look stale to a later launch: refused, never cancelled unasked


def registered_run_dir(tag: str) -> str:
    try:
        path = registry_path(tag)
        if owned.state_folder(False, "cluster.backend", os.path.dirname(path), "step tags") is None:
            return ""
        with open(owned.open_state_file(path, os.O_RDONLY, "cluster.backend"),
                  encoding="utf-8") as f:
            return f.read(4096).strip()
    except (OSError, SpecError):
        return ""


def batch_run_dir(record: dict | None) -> str:
    """The run directory of a podlaunch batch job (its output is ``RUN_DIR/slurm/batch-%j.out``)."""
    out = (record or {}).get("StdOut", "")
    parent = os.path.dirname(out)
    return os.path.dirname(parent) if os.path.basename(parent) == "slurm" else ""


def queued_jobs(slurm, name: str) -> tuple[list, list]:
    """This user's queued jobs named ``name``, as ``(stale, beside)``: lists of
    ``(job id, state, run dir or "")``; ``beside``: their launcher holds their run dir. A job
    whose lock is free is read again after the lock: a launcher releases it only once its job
    has left the queue, so a launch that ended between the two reads is neither."""
    stale, beside = [], []
    for job_id, state in slurm.jobs_named(name):
        run_dir = batch_run_dir(slurm.job(job_id))
        if run_dir and runlock.held(run_dir):
            beside.append((job_id, state, run_dir))
            continue
        again = slurm.job(job_id)
        if lifecycle.phase(again) in (Phase.RUNNING, Phase.SETTLING, Phase.WAITING):
            stale.append((job_id, again.get("JobState", state), run_dir))
    return stale, beside


def job_steps(slurm, job_id: str, name: str, own_prefix: str) -> tuple[list, list]:
    """The steps of job ``name`` in allocation ``job_id``, as ``(own, stale)``: lists of
    ``(step id, step name)``; ``own``: this launch's (``own_prefix``); another live
    launch's steps are in neither."""
    own, stale = [], []
    for step, step_name in slurm.steps_named(job_id, name + "."):
        if step_name.startswith(own_prefix):
            own.append((step, step_name))
            continue
        other = registered_run_dir(step_name[len(name) + 1:].split(".")[0])
        if not (other and runlock.held(other)):
            stale.append((step, step_name))
    if stale:  # listed again after the locks, as ``queued_jobs`` reads a job again
        left = set(slurm.steps_named(job_id, name + "."))
        stale = [s for s in stale if s in left]
    return own, stale
