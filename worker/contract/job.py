"""The job as the worker reads it: ``job.json``, typed, every key required.

Half of the launcher-worker contract (``worker.contract`` has the other half,
the identity in the environment, and the progress lines). Built by the
launcher from its typed spec (``WorkerJob.from_spec``: the spec's own section objects,
``worker.contract.sections``, without the launcher's own; no dict round trip), written with ``to_json`` (mode
0600: ``task.args`` may hold secrets) and read by the worker with ``from_json``
into the same section classes, every key required. What does not fit raises
``worker.contract.ContractError`` naming the dotted key.

Two kinds: ``WorkerJob`` for the built-in trainer (``python -m worker`` reads it) and
``ProgramJob`` for a user's program (``worker.program`` reads it). Each reader knows its
kind; the launcher writes the one its job's kind says (``job_file`` of
``launcher.spec.kinds``), so nothing here tells them apart from the file.

Standard library only, like ``worker.contract``: the launcher imports it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from worker.contract import runfiles, sections
from worker.contract.fields import ContractError, admits, describe_value, expected_type, hints_of


# ---- the job: job.json -----------------------------------------------------------------------
# The sections are the spec's own (worker.contract.sections: declared once for both sides); here
# every key is required, since the launcher wrote them all.
_Section = sections._Section


class _JobFile(_Section):
    """Reading and writing a job file (``job.json``); shared by ``WorkerJob`` and ``ProgramJob``."""

    def to_dict(self) -> dict:
        """Nested plain dicts, in field order (JSON-ready)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "WorkerJob":
        """The job ``to_dict`` made (e.g. read back from JSON).

        Raises:
          ContractError: a key is missing or unknown, a section is not a
            mapping, or a value has the wrong type; it lists every such
            problem, each with its dotted key.
        """
        problems: list = []
        job = _build(cls, d, "", problems)
        if problems:
            raise ContractError("job: " + "; ".join(problems))
        return job

    @classmethod
    def from_spec(cls, spec: Any) -> "WorkerJob":
        """This job file out of the launcher's typed spec (a ``launcher.spec`` job), its own
        section objects taken as they are: the spec's sections are this file's classes
        (``worker.contract.sections``, declared once for both sides), and a section of a subclass (a
        program's ``ProgramSpec``, which adds the command) gives the fields this file
        declares. A tuple is written as the list JSON reads back.

        Raises:
          AttributeError: ``spec`` lacks a section this file needs.
        """
        hints = hints_of(cls)
        values = {}
        for field in dataclasses.fields(cls):
            value, hint = getattr(spec, field.name), hints[field.name]
            if dataclasses.is_dataclass(hint):
                value = hint(**{f.name: _as_read(getattr(value, f.name))
                                for f in dataclasses.fields(hint)})
            values[field.name] = _as_read(value)
        return cls(**values)

    def to_json(self, path: str) -> None:
        """Write ``to_dict()`` as JSON to ``path``, mode 0600 (it may hold the task's secrets),
        replaced whole: a link at ``path`` is replaced, never written through (``runfiles``).

        Raises:
          OSError: it cannot be written.
        """
        runfiles.write_whole(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_json(cls, path: str) -> "WorkerJob":
        """Read a job ``to_json`` wrote.

        Raises:
          OSError: the file cannot be read.
          ContractError: it is not JSON, or not a job (see ``from_dict``).
        """
        with open(path, "r", encoding="utf-8", opener=runfiles.opener) as f:
            text = f.read()
        try:
            d = json.loads(text)
        except ValueError as exc:
            raise ContractError(f"{path}: not JSON: {exc}") from None
        try:
            return cls.from_dict(d)
        except ContractError as exc:
            raise ContractError(f"{path}: {exc}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerJob(_JobFile):
    """What one worker trains: the part of the resolved spec the worker reads.

    Attributes:
      name: the job's name (shown in TensorBoard's text tab).
      task, data, optimizer, train, logging, distributed, checkpoint, watchdog, profile:
        the spec's sections of the same names, each with only the keys the
        worker reads.
      secrets: the spec's ``secrets`` (key names masked, with ``worker.contract.redact``'s
        rule, in what the worker writes: TensorBoard's spec text and hparams).
    """

    name: str
    secrets: list[str]
    task: sections.Task
    data: sections.Data
    optimizer: sections.Optimizer
    train: sections.Train
    logging: sections.Logging
    distributed: sections.Distributed
    checkpoint: sections.Checkpoint
    watchdog: sections.Watchdog
    profile: sections.Profile


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProgramJob(_JobFile):
    """What ``worker.program`` (the helper a user's program calls) reads: a program job's
    ``job.json``. The trainer's sections are absent: the program trains itself.

    Attributes:
      name, secrets, logging, distributed, watchdog, profile: as in ``WorkerJob``.
      program: what the helper needs to know of the program (``num_steps``).
      checkpoint: ``notice_grace_s`` (``worker.program.stop_after``); the rest is the trainer's.
    """

    name: str
    secrets: list[str]
    program: sections.ProgramSteps
    logging: sections.Logging
    distributed: sections.Distributed
    watchdog: sections.Watchdog
    checkpoint: sections.Checkpoint
    profile: sections.Profile


def _build(cls, d: Any, prefix: str, problems: list):
    """Build dataclass ``cls`` from mapping ``d``; append ``"dotted.key: problem"`` to ``problems``."""
    if not isinstance(d, dict):
        problems.append(f"{prefix.rstrip('.') or '(top level)'}: expected a mapping, "
                        f"got {describe_value(d)}")
        return None
    hints = hints_of(cls)
    names = [field.name for field in dataclasses.fields(cls)]
    problems += [f"{prefix}{key}: unknown key" for key in d if key not in names]
    values, ok = {}, True
    for name in names:
        key = prefix + name
        if name not in d:
            problems.append(f"{key}: missing")
            ok = False
        elif dataclasses.is_dataclass(hints[name]):
            values[name] = _build(hints[name], d[name], key + ".", problems)
            ok = ok and values[name] is not None
        elif not admits(hints[name], d[name]):
            problems.append(f"{key}: expected {expected_type(hints[name])}, got {describe_value(d[name])}")
            ok = False
        else:
            values[name] = d[name]
    return cls(**values) if ok else None


def _as_read(value: Any) -> Any:
    """``value`` as ``from_dict`` would give it back from JSON: a tuple as a list."""
    return list(value) if isinstance(value, tuple) else value
