"""What a ``--resume`` may change, and what it may not: settings that decide which examples
form each step's batch, or what the task is, are the run's; changing one mid-run would train
every later step on other batches than the run's checkpoints were made with, without a word.

A checkpoint refuses what it can see (its leaves' shapes, the batches per epoch, the data
order), but ``train.global_batch_size`` from 128 to 150 over 300 rows keeps 2 batches per
epoch while every batch after the resume holds other rows. Those keys are compared here,
from the run's ``spec.yaml`` (what its attempts ran), before anything is written or started;
anything else that changed (``num_steps``, the optimizer's rate, the cluster) is said by the
launch and goes on.
"""

from __future__ import annotations

import json
import os
import shlex

import yaml

from launcher import owned
from launcher.errors import Problem, SpecError
from worker import contract
from worker.contract import runfiles

# which examples form each batch, and what is trained on them (prefixes end with '.')
TRAINED = ("train.global_batch_size", "data.", "task.")
NOT_TRAINED = ("data.prefetch", "data.resident")  # how batches are read, not which
UNSET = "(unset)"


def changes(run_dir: str, masked: dict) -> list:
    """``(key, before, now)`` for every setting in which ``masked`` (the spec about to run,
    secrets masked) differs from the run's ``spec.yaml``; ``UNSET`` for a key one lacks."""
    earlier = spec_of(run_dir)
    if not earlier:
        return []
    now = flat(json.loads(json.dumps(masked)))  # tuples as lists, as YAML read them back
    return [(key, earlier.get(key, UNSET), now.get(key, UNSET))
            for key in sorted(set(earlier) | set(now)) if earlier.get(key) != now.get(key)]


def trained(key: str) -> bool:
    """Whether ``key`` (dotted) decides which examples form each batch or what is trained."""
    return key not in NOT_TRAINED and any(key == t or (t.endswith(".") and key.startswith(t))
                                          for t in TRAINED)


def check(run_dir: str, masked: dict) -> None:
    """Refuse a resume that changes what is trained.

    Raises:
      SpecError: one problem per such key (its value before and now, and what to do); nothing
        was written or started.
    """
    refused = [(key, before, now) for key, before, now in changes(run_dir, masked)
               if trained(key) and UNSET not in (before, now)]  # a key another version lacked
    if refused:
        raise SpecError([Problem("--resume", None, key, (
            f"{before!r} -> {now!r} changes what is trained (which examples form each step's "
            f"batch, or the task), so every step after the resume would differ from the run's; "
            f"resume with the run's value ({_set_flag(key, before)}) or start a new run with "
            f"--run-dir")) for key, before, now in refused])


def _set_flag(key: str, value) -> str:
    """``--set KEY=VALUE`` that gives ``key`` back ``value``, as a shell would take it."""
    text = value if isinstance(value, str) else json.dumps(value)  # false, null, [1, 2]
    return f"--set {shlex.quote(f'{key}={text}')}"


def newest_checkpoint(run_dir: str, local_dir: str = "local-checkpoints") -> int | None:
    """The newest step saved for the run in ``run_dir`` on this machine: process 0's
    checkpoints (``checkpoints/``) and the local tier's copies (``process-NNN`` under
    ``checkpoint.local_dir``, ``local_dir``: the run's own directory there when it lies
    outside the run, ``runfiles.local_tier_base``); None when there are none here."""
    dirs = [os.path.join(run_dir, "checkpoints")]
    base = runfiles.local_tier_base(local_dir, run_dir)
    try:
        dirs += [os.path.join(base, name) for name in os.listdir(base)]
    except OSError:
        pass
    steps = []
    for path in dirs:
        try:
            steps += [step for step, _ in contract.checkpoints_in(os.listdir(path))]
        except OSError:
            continue
    return max(steps, default=None)


def check_steps_left(run_dir: str, job, earlier: dict) -> None:
    """Refuse a resume whose ``num_steps`` is below the run's newest checkpoint: it would
    restore that step and train nothing (and end as succeeded at a step past its last).

    Raises:
      SpecError: naming the key, the checkpoint's step, the run's own value and what to do.
    """
    local_dir = job.checkpoint.local_dir
    newest, num_steps = newest_checkpoint(run_dir, local_dir), job.num_steps
    if newest is None or num_steps is None or num_steps >= newest:
        return
    section, key = job.num_steps_key.split(".")
    before = (earlier.get(section) or {}).get(key) if isinstance(earlier.get(section), dict) else None
    # the run's own value only where it is above the checkpoint (an earlier resume may have
    # lowered it)
    theirs = (f"the run's value ({_set_flag(job.num_steps_key, before)}) or "
              if isinstance(before, int) and before > newest else "")
    raise SpecError([Problem("--resume", None, job.num_steps_key, (
        f"{num_steps}, below step {newest}, the run's newest checkpoint: the resume would "
        f"restore it and train nothing; resume with {theirs}any value above {newest}, or "
        "start a new run with --run-dir"))])


def resume_dir(job, run_dir: str, flag: str = "--resume") -> str:
    """Check that ``--resume RUN_DIR`` names a run of this job.

    Raises:
      SpecError: no such run directory, it holds another job's run, or the spec changes
        what the run trains (``launcher.rundir.specdiff``).
    """
    run_dir = owned.real_path(run_dir)  # one run, one path: its live processes are found by it
    owned.check_dir(run_dir, flag)  # another user's, or open to others: refused first
    spec_file = os.path.join(run_dir, "spec.yaml")
    try:
        earlier = yaml.safe_load(runfiles.read_regular(spec_file))
        why = None if isinstance(earlier, dict) else "not a mapping of settings"
    except OSError as exc:
        why = exc.strerror or str(exc)
    except (yaml.YAMLError, RecursionError) as exc:  # PyYAML's own text is not for the console
        mark = getattr(exc, "problem_mark", None)
        why = "not valid YAML" + (f" at line {mark.line + 1}" if mark is not None else "")
    if why is not None:
        raise SpecError([Problem(flag, None, "", f"{run_dir} is not a run directory (cannot "
                                 f"read {spec_file}: {why}); pass the directory a launch printed")])
    if earlier.get("name") != job.name:
        raise SpecError([Problem(flag, None, "", f"{run_dir} holds a run of job "
                                 f"{earlier.get('name')!r}, not {job.name!r}; pass that job's spec")])
    check(run_dir, job.to_masked_dict())
    check_steps_left(run_dir, job, earlier)
    return run_dir


def flat(value, prefix: str = "") -> dict:
    """A nested dict as ``{"dotted.key": leaf}``."""
    if isinstance(value, dict):
        out: dict = {}
        for key, inner in value.items():
            out.update(flat(inner, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def spec_of(run_dir: str) -> dict:
    """The run's resolved spec (``spec.yaml``), flattened to dotted keys; {} if unreadable."""
    import yaml  # the launcher's own dependency; ``launch runs`` alone does not need it

    try:
        return flat(yaml.safe_load(runfiles.read_regular(os.path.join(run_dir, "spec.yaml"))) or {})
    except (OSError, yaml.YAMLError, RecursionError):  # a deeply nested file too
        return {}
