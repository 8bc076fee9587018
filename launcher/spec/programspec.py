"""The ``program:`` section of a job spec: the user's own command in place of the trainer.

A program job names a command (``argv``), the directory it runs from (synced
to ssh/tpu hosts like ``sync_dir``), extra environment, and optionally the
number of steps it reports (``worker.program``). It has none of the trainer's
sections (``TRAINER_SECTIONS``): combining them is a spec error naming both.
"""

from __future__ import annotations

import dataclasses
import os
import re

import worker
from launcher.spec import schema, syncrules
from worker.contract import sections
from worker.contract import valuechecks
from worker.contract.sections import setting


def _argv(value: tuple) -> str | None:
    if not value:
        return "expected a non-empty list: the command and its arguments, e.g. [python, train.py]"
    if not value[0].strip():
        return "argv[0] is empty; name the command (python, or a path)"
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProgramSpec(sections.ProgramSteps):
    """Your own program as every process's worker, in place of task/data/optimizer/train
    (``num_steps``, what the worker reads too, is ``worker.contract.sections.ProgramSteps``')."""

    argv: tuple[str, ...] = setting(check=_argv, doc="the command and its arguments; argv[0] "
                                    "'python' or 'python3' is the cluster's python")
    dir: str | None = setting(None, check=valuechecks.LOCAL_PATH,
                              doc="directory the program runs from, relative to the spec file "
                              "(default: the spec file's directory); synced into each ssh/tpu "
                              "host's workdir")
    env: dict[str, schema.EnvValue] = setting({}, check=schema.env_names,
                                              doc="extra environment for the program")
    include: tuple[str, ...] = setting((), doc="globs synced even if skipped by default (build, "
                                       "node_modules, ...) or looking like a secret (id_*, *.pem)")
    exclude: tuple[str, ...] = setting((), doc="globs (relative paths or names) never synced")

    @property
    def sync_rules(self) -> syncrules.Rules:
        return syncrules.Rules(tuple(self.include), tuple(self.exclude))


# The trainer's sections: a program job has none of them.
TRAINER_SECTIONS = ("task", "data", "optimizer", "train")
# Settings of the other sections that only the built-in trainer acts on: refused in a
# program job rather than accepted and ignored.
IGNORED_BY_PROGRAMS = (
    ("checkpoint", "every_steps", "the program saves its own checkpoints (worker.program."
     "checkpoint_dir(); checkpoint.keep still bounds the copies kept over ssh)"),
    ("checkpoint", "local_every_steps", "the program saves its own checkpoints; the local tier "
     "is the built-in trainer's"),
    ("checkpoint", "local_dir", "the program saves its own checkpoints; the local tier is the "
     "built-in trainer's"),
    ("logging", "on_nonfinite_loss", "the program decides what a NaN loss means (worker.program."
     "report logs the values it is given)"),
)
# How a program imports podlaunch's helper by its old name; a worker.py (or worker/) of its
# own beside it comes first on sys.path (the script's directory) and hides the package.
# `from podlaunch import program` cannot clash that way.
_USES_HELPER = re.compile(r"^\s*(from\s+worker(\.program)?\s+import\b|import\s+worker\.program\b)",
                          re.M)


def _shadowing_worker(directory: str) -> str | None:
    """Why ``directory``'s own ``worker`` module would hide podlaunch's, or None."""
    own = [name for name in ("worker.py", os.path.join("worker", "__init__.py"))
           if os.path.isfile(os.path.join(directory, name))]
    ours = os.path.realpath(os.path.dirname(worker.__file__))
    if not own or os.path.realpath(os.path.join(directory, "worker")) == ours and own[0] != "worker.py":
        return None  # none, or podlaunch's own package (a program kept in podlaunch's checkout)
    users = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".py") and name != "worker.py":
            try:
                with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as f:
                    if _USES_HELPER.search(f.read(1_000_000)):
                        users.append(name)
            except OSError:
                continue
    if not users:
        return None
    return (f"{os.path.join(directory, own[0])} hides podlaunch's worker package from "
            f"{', '.join(users)} (the script's directory comes first on sys.path, so "
            "'from worker import program' would fail); write 'from podlaunch import program', "
            "podlaunch's own name for the helper, or rename it")


def job_type(raw: dict, ctx: schema.Context, trainer, program):
    """Which kind of job ``raw`` (the spec's top-level mapping) is: ``program`` when it has a
    program: section, else ``trainer``; None when it has neither program nor train (said).

    A program job with one of the trainer's sections is an error naming both; those
    sections are taken out of ``raw`` so that the build does not call them unknown too.
    """
    if schema.given(raw, "program"):
        for key in [k for k in TRAINER_SECTIONS if schema.given(raw, k)]:
            ctx.error((key,), f"cannot be combined with program: a program job runs its own "
                      f"training; remove {key} (or program)")
            raw.pop(key)
        return program
    if not schema.given(raw, "train"):
        ctx.error(("train",), "missing; expected a mapping (num_steps, global_batch_size), "
                  "or a program: section to run your own program")
        return None
    return trainer


def check_program(spec, raw: dict, ctx: schema.Context):
    """Cross-field checks of a program job (``spec``: a ``launcher.spec.ProgramJobSpec``): its
    directory exists (made absolute), nothing of the trainer's that it would ignore, no
    module of its own that hides podlaunch's. Returns the spec."""
    program = spec.program
    base = os.path.dirname(os.path.abspath(spec.source))
    full = os.path.normpath(os.path.join(base, os.path.expanduser(program.dir or ".")))
    if not os.path.isdir(full):
        ctx.error(("program", "dir"), f"no such directory: {full} "
                  f"({schema.relative_to(ctx, ('program', 'dir'))})")
    for section, key, why in IGNORED_BY_PROGRAMS:
        if schema.given(raw.get(section), key):
            ctx.error((section, key), f"does not apply to a program job: {why}; remove it")
    if os.path.isdir(full):
        shadow = _shadowing_worker(full)
        if shadow:
            ctx.error(("program", "dir"), shadow)
    watchdog = spec.watchdog
    if not schema.given(raw.get("watchdog"), "first_step_timeout_s"):
        # a program that never reports has no first step: only an explicit timeout applies
        watchdog = dataclasses.replace(watchdog, first_step_timeout_s=None)
    return dataclasses.replace(spec, program=dataclasses.replace(program, dir=full),
                               watchdog=watchdog)
