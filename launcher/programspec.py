"""The ``program:`` section of a job spec: the user's own command in place of the trainer.

A program job names a command (``argv``), the directory it runs from (synced
to ssh/tpu hosts like ``sync_dir``), extra environment, and optionally the
number of steps it reports (``worker.program``). It has none of the trainer's
sections (``TRAINER_SECTIONS``): combining them is a spec error naming both.
"""

from __future__ import annotations

import dataclasses
import os

from launcher import schema, syncrules
from launcher.schema import positive, setting


def _argv(value: tuple) -> str | None:
    if not value:
        return "expected a non-empty list: the command and its arguments, e.g. [python, train.py]"
    if not value[0].strip():
        return "argv[0] is empty; name the command (python, or a path)"
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProgramSpec:
    """Your own program as every process's worker, in place of task/data/optimizer/train."""

    argv: tuple[str, ...] = setting(check=_argv, doc="the command and its arguments; argv[0] "
                                    "'python' or 'python3' is the cluster's python")
    dir: str | None = setting(None, check=schema.LOCAL_PATH,
                              doc="directory the program runs from, relative to the spec file "
                              "(default: the spec file's directory); synced into each ssh/tpu "
                              "host's workdir")
    env: dict[str, schema.EnvValue] = setting({}, check=schema.env_names,
                                              doc="extra environment for the program")
    num_steps: int | None = setting(None, check=positive,
                                    doc="steps the program will report (worker.program.report); "
                                    "an exit 0 before it reported the last one is a failure")
    include: tuple[str, ...] = setting((), doc="globs synced even if skipped by default (build, "
                                       "node_modules, ...) or looking like a secret (id_*, *.pem)")
    exclude: tuple[str, ...] = setting((), doc="globs (relative paths or names) never synced")

    @property
    def sync_rules(self) -> syncrules.Rules:
        return syncrules.Rules(tuple(self.include), tuple(self.exclude))


# The trainer's sections: a program job has none of them.
TRAINER_SECTIONS = ("task", "data", "optimizer", "train")


def check_program(spec, raw: dict, ctx: schema.Context):
    """Cross-field checks of a program job (``spec``: a ``launcher.spec.JobSpec``), or of a job
    with neither program nor train: none of the trainer's sections, and its directory exists
    (made absolute). Returns the spec."""
    if spec.program is None:  # neither: the trainer's train section is missing
        ctx.error(("train",), "missing; expected a mapping (num_steps, global_batch_size), "
                  "or a program: section to run your own program")
        return spec
    mixed = [key for key in TRAINER_SECTIONS if schema.given(raw, key)]
    for key in mixed:
        ctx.error((key,), f"cannot be combined with program: a program job runs its own "
                  f"training; remove {key} (or program)")
    program = spec.program
    base = os.path.dirname(os.path.abspath(spec.source))
    full = os.path.normpath(os.path.join(base, os.path.expanduser(program.dir or ".")))
    if not os.path.isdir(full):
        ctx.error(("program", "dir"), f"no such directory: {full} (paths are relative to the "
                  "spec file)")
    watchdog = spec.watchdog
    if not schema.given(raw.get("watchdog"), "first_step_timeout_s"):
        # a program that never reports has no first step: only an explicit timeout applies
        watchdog = dataclasses.replace(watchdog, first_step_timeout_s=None)
    return dataclasses.replace(spec, program=dataclasses.replace(program, dir=full),
                               task=None, data=None, optimizer=None, watchdog=watchdog)
