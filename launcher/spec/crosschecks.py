"""Checks across a job's sections, made once every section has loaded on its own.

``launcher.spec.load`` calls ``check_job`` with the frozen spec, the raw mapping
(to tell what the user wrote from a default) and the schema context (file and
line of every key), so each problem names the key that is wrong.
"""

from __future__ import annotations

import dataclasses
import os

from launcher.spec import datafiles, schema
from launcher.spec.checks import BUILTIN_TASKS
from worker.contract import periods
from worker.contract.tasks import BUILTIN_TASK_ARGS, task_arg_problem
from launcher.words import plural


def check_job(spec, raw: dict, ctx: schema.Context):
    """Cross-field checks of a loaded ``launcher.spec.JobSpec``: the profile window and
    shrinking, then the kind's own (``spec.checked``: the trainer's ``check_trainer``, a
    program's ``programspec.check_program``). Problems go to ``ctx``; returns the spec as the
    kind's checks leave it (paths made absolute, ``data_rows`` counted)."""
    _check_profile(spec, ctx)
    _check_shrink(spec, ctx)
    return spec.checked(raw, ctx)


def check_trainer(spec, raw: dict, ctx: schema.Context):
    """Cross-field checks of a ``launcher.spec.TrainerJobSpec``: the batch over devices, fused
    steps, data source settings, data files. Problems go to ``ctx``; returns the spec (with
    ``data.path`` made absolute and ``data_rows`` counted)."""
    train, data = spec.train, spec.data
    _check_task_args(spec, ctx)
    if train.global_batch_size % spec.device_count:
        ctx.error(("train", "global_batch_size"),
                  f"{train.global_batch_size} does not divide evenly over device_count "
                  f"{spec.device_count} ({plural(spec.num_processes, 'process')} x "
                  f"{plural(spec.local_device_count, 'device')}); use a multiple of {spec.device_count}")
    k = train.steps_per_call  # auto: the worker picks a divisor of all (worker.trainer.calls)
    # every period that ends a call (the last step, the saves: worker.contract.periods)
    for key, value in periods.of(spec, periods.ENDS_A_CALL):
        if k != "auto" and value % k:
            ctx.error(key, f"{value} is not a multiple of train.steps_per_call {k} (steps run "
                      f"{k} to a device call, and are saved and ended at call boundaries); use "
                      f"a multiple of {k}, or train.steps_per_call: auto")
    raw_data = raw.get("data") or {}
    if data.resident and data.shuffle:
        ctx.error(("data", "resident"), "cannot be used with data.shuffle: true (every epoch's "
                  "batches are new); remove one of them")
    if data.source == "synthetic":
        if data.path is not None:
            ctx.error(("data", "path"), "only used with data.source: file; set data.source: file "
                      "or remove data.path")
        if data.num_examples < train.global_batch_size:
            ctx.error(("data", "num_examples"),
                      f"{plural(data.num_examples, 'row')} cannot fill one global batch of "
                      f"{train.global_batch_size}; raise it or lower train.global_batch_size")
        if schema.given(raw_data, "target_dtype"):
            ctx.error(("data", "target_dtype"), "only used with data.source: file (.npy, .csv); "
                      "remove it")
        return dataclasses.replace(spec, data_rows=data.num_examples)
    for key in ("num_examples", "in_features", "out_features", "noise_std", "seed"):
        if schema.given(raw_data, key):
            ctx.error(("data", key), "only used with data.source: synthetic; remove it")
    if data.path is None:
        ctx.error(("data", "path"), "missing; data.source: file needs a path to a .npy, .npz or .csv")
        return spec
    base = os.path.dirname(os.path.abspath(spec.source))
    full = os.path.normpath(os.path.join(base, os.path.expanduser(data.path)))
    if not os.path.exists(full):
        ctx.error(("data", "path"), f"no such file: {full} ({schema.relative_to(ctx, ('data', 'path'))})")
        return spec
    try:
        rows, columns = datafiles.shape(full)
        datafiles.check_values(full)  # a NaN in a .npy is found now, not in a worker
    except datafiles.DataFileError as exc:
        ctx.error(("data", "path"), f"{full}: {exc}")
        return spec
    if full.endswith(".npz") and spec.task.name in BUILTIN_TASKS:
        missing = [n for n in ("x", "y") if n not in datafiles.npz_arrays(full)]
        if missing:
            ctx.error(("data", "path"), f"{full}: task {spec.task.name} reads arrays x and y; "
                      f"{' and '.join(missing)} missing: save with numpy.savez(path, x=features, "
                      "y=targets)")
    if full.endswith(".npz") and schema.given(raw_data, "target_dtype"):
        ctx.error(("data", "target_dtype"), "an .npz keeps each array's own dtype; remove it "
                  "(save labels with an integer dtype)")
    if not full.endswith(".npz") and not -columns <= data.target_column < columns:
        ctx.error(("data", "target_column"),
                  f"expected a column index from {-columns} to {columns - 1}, got {data.target_column}")
    if rows < train.global_batch_size:
        ctx.error(("train", "global_batch_size"),
                  f"{train.global_batch_size} is more than the {rows} rows of {full}; lower it")
    return dataclasses.replace(spec, data=dataclasses.replace(data, path=full), data_rows=rows)


def _check_task_args(spec, ctx: schema.Context) -> None:
    """A built-in task's ``task.args``: every argument one it takes, of its kind, and the
    required ones given (``worker.contract.tasks``). A user's task (``module:function``) is
    its own: its function says at the workers' start."""
    takes = BUILTIN_TASK_ARGS.get(spec.task.name)
    if takes is None:
        return
    name, args = spec.task.name, spec.task.args or {}
    listed = ", ".join(f"{arg} ({what}{'' if required else ', optional'})"
                       for arg, (required, what) in takes.items())
    for arg, value in args.items():
        if arg not in takes:
            import difflib

            close = difflib.get_close_matches(str(arg), list(takes), n=1)
            ctx.error(("task", "args", arg), f"{name} takes no argument {arg!r}"
                      + (f"; did you mean {close[0]!r}?" if close else "")
                      + (f" (it takes {listed})" if takes else "; it takes none: remove it"))
        elif (problem := task_arg_problem(takes[arg][1], value)) is not None:
            ctx.error(("task", "args", arg), problem)
    for arg, (required, what) in takes.items():
        if required and arg not in args:
            ctx.error(("task", "args"), f"{name} needs {arg} ({what}): add it under task.args, "
                      f"e.g. task.args.{arg}")


def _check_shrink(spec, ctx: schema.Context) -> None:
    """``restarts.min_processes``: a floor at or under the job's processes, on a backend
    whose hosts can be dropped (ssh)."""
    floor = spec.restarts.min_processes
    if floor is None:
        return
    if not spec.cluster.can_shrink:
        ctx.error(("restarts", "min_processes"),
                  f"cluster.backend {spec.cluster.backend} cannot shrink a run (ssh can: hosts "
                  "dropped one by one; Slurm places a resubmitted job on other nodes itself); "
                  "remove it")
    elif floor > spec.num_processes:
        ctx.error(("restarts", "min_processes"),
                  f"{floor} is more than the job's {plural(spec.num_processes, 'process')}; "
                  f"use at most {spec.num_processes}")


def _check_profile(spec, ctx: schema.Context) -> None:
    """The spec's profile window ends at or before the job's last step (when it is known)."""
    profile = spec.profile
    if profile.start_step is None:
        return
    total, key = spec.num_steps, spec.num_steps_key
    last = profile.start_step + profile.num_steps - 1
    why = spec.profile_start_problem(profile.start_step)
    if why:
        ctx.error(("profile", "start_step"), why)
    elif total is not None and last > total:
        ctx.error(("profile", "start_step"),
                  f"steps {profile.start_step}-{last} (profile.num_steps {profile.num_steps}) run "
                  f"past the job's last step, {key} {total}; lower profile.start_step or "
                  "profile.num_steps")
