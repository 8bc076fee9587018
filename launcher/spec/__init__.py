"""The job spec: YAML -> validated, frozen dataclasses, before anything starts.

A spec names a task, its data, an optimizer, the training schedule, logging,
JAX's distributed settings, and the cluster it runs on. ``load`` reads the
file (and optionally a separate cluster file and ``--set`` overrides), checks
everything, and raises one ``SpecError`` listing every problem found:

    jobs/linear.yaml:12: train.learning_rate: expected a number > 0, got 'fast'

Derived values (``num_processes``, ``device_count``, ``per_device_batch_size``)
are properties, never typed by the user.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Literal

from launcher.spec import crosschecks, datafiles, kinds, schema, yamlio
from launcher.errors import Problem, SpecError
from launcher.spec import programspec
from launcher.spec.notifyspec import NotifySpec
from launcher.spec.programspec import ProgramSpec
from worker.contract.sections import MISSING, setting
from worker.contract.valuechecks import non_negative
from worker.contract import redact
from worker.contract import sections
from worker.contract import valuechecks

# The job's sections, declared once in worker.contract.sections (the worker reads the same classes
# back from job.json); the launcher adds restarts, program, cluster and secrets.

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
EXTENSION_PREFIX = "x-"

_job_name = valuechecks.identifier("a job name", _NAME.pattern,
                              "letters, digits, '_', '.', '-', at most 128; it names the run directory",
                              r"[A-Za-z0-9_.-]")


def _exit_codes(codes: tuple) -> str | None:
    bad = [c for c in codes if not 1 <= c <= 255]
    return f"expected exit codes 1 to 255, got {bad}" if bad else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RestartSpec:
    """``restarts``: a budget for each class of failure (``launcher.run.classes``), so a
    long run survives preemptions and lost hosts by default while an error in the job
    itself fails at once."""

    program_errors: int = setting(0, check=valuechecks.in_range(0, 1000),
                                  doc="restarts after an error of the job itself (a Python error, "
                                  "an exit code not in retry_exit_codes, an early exit 0, a join "
                                  "that never happens): a restart usually repeats it "
                                  "(docs/recovery.md#failure-classes-and-their-budgets)")
    infrastructure: int = setting(10, check=valuechecks.in_range(0, 1000),
                                  doc="restarts after a fault of the machines: a death by a signal "
                                  "without notice (SIGKILL, the OOM killer), a lost host or "
                                  "connection, a node failure, an exit code in retry_exit_codes")
    preemptions: int = setting(100, check=valuechecks.in_range(0, 10000),
                               doc="restarts after a preemption: SIGTERM from the system (exit "
                               "143), a Slurm job preempted or requeued")
    stalls: int = setting(3, check=valuechecks.in_range(0, 1000),
                          doc="restarts after the watchdog found a process without progress")
    max_restarts: int | None = setting(None, check=valuechecks.in_range(0, 10000),
                                       doc="a cap on restarts of every class together (null: each "
                                       "class's budget alone)")
    backoff_s: float = setting(5.0, check=non_negative,
                               doc="wait before a restart after a program error or a stall, and "
                               "before a second infrastructure fault or preemption in a row (the "
                               "first restarts at once); doubles as the same class repeats")
    quarantine_after: int = setting(2, check=valuechecks.in_range(1, 1000),
                                    doc="a host whose processes failed this many times in a run "
                                    "(infrastructure faults and stalls) is not used again while "
                                    "a spare (cluster.spares, ssh) or shrinking can take its "
                                    "place (docs/recovery.md#keep-going-without-a-host-spares-"
                                    "shrinking-quarantine)")
    quarantine_slower_than: float | None = setting(
        None, check=valuechecks.in_range(1.0, 1000.0),
        doc="also quarantine, at the next restart, a host whose processes' own time per step "
        "(outside JAX: the own of the progress lines) was more than this many times the median "
        "of the other hosts' "
        "processes, and 10 ms more; null: never for slowness")
    min_processes: int | None = setting(None, check=valuechecks.in_range(1, 100000),
                                        doc="ssh: shrink onto the hosts left, down to this many "
                                        "processes, when a host is gone or quarantined and no "
                                        "spare is left; the global batch stays and the step stays "
                                        "exact (padded rows of weight 0, a weighted mean); "
                                        "null: never shrink")
    retry_exit_codes: tuple[int, ...] = setting(
        (), check=_exit_codes,
        doc="worker exit codes counted as infrastructure faults (137, SIGKILL as a shell reports "
        "it, always is; 143, SIGTERM's, is always a preemption); exit 1 (a Python error) is a "
        "program error unless listed")


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A validated job: a ``TrainerJobSpec`` (the built-in trainer) or a ``ProgramJobSpec``
    (the user's own program), over this base of what every job has. ``source`` is the
    spec file it came from. Each kind answers for itself what the launcher asks of a job
    (its steps, command, working directory, whether it reads data: ``launcher.spec.kinds``);
    which kind a job is, is decided once, by ``programspec.job_type`` as the spec is built."""

    name: str = setting(check=_job_name, doc="job name; names the run directory")
    logging: sections.Logging = setting(sections.Logging())
    distributed: sections.Distributed = setting(sections.Distributed())
    checkpoint: sections.Checkpoint = setting(sections.Checkpoint())
    restarts: RestartSpec = setting(RestartSpec())
    watchdog: sections.Watchdog = setting(sections.Watchdog())
    profile: sections.Profile = setting(sections.Profile())
    notify: NotifySpec = setting(NotifySpec())
    cluster: Any = setting(None, doc="where it runs (default: cluster.backend local); see the "
                           "cluster reference")
    secrets: tuple[str, ...] = setting((), doc="key names (any depth: cluster.env, task.args) whose "
                                       "values are masked in everything printed or written, "
                                       "besides the names worker.contract.redact recognises")
    source: str = dataclasses.field(default="", compare=False, metadata={"internal": True})
    # rows of the dataset (synthetic: num_examples; file: counted at load)
    data_rows: int = dataclasses.field(default=0, compare=False, metadata={"internal": True})
    # key path -> (file or "--set", line), for the checks made after loading (LATE_CHECKED)
    locations: dict = dataclasses.field(default_factory=dict, compare=False,
                                        metadata={"internal": True})

    @property
    def num_processes(self) -> int:
        return self.cluster.num_processes_total

    @property
    def local_device_count(self) -> int:
        return self.cluster.resolved_devices_per_process

    @property
    def device_count(self) -> int:
        return self.num_processes * self.local_device_count

    @property
    def per_device_batch_size(self) -> int:
        return self.train.global_batch_size // self.device_count

    def where(self, key: tuple) -> tuple:
        """(file or ``--set``, line or None) that set ``key`` (one of ``LATE_CHECKED``, or a
        task argument), or its nearest such parent."""
        for cut in range(len(key), 0, -1):
            if key[:cut] in self.locations:
                return self.locations[key[:cut]]
        return self.source, None

    def to_dict(self) -> dict:
        """The resolved spec as plain values, its sections in the order a spec file has them."""
        out = dataclasses.asdict(self)
        for internal in ("source", "locations", "data_rows"):
            out.pop(internal)
        return {key: out[key] for key in SECTION_ORDER if key in out}

    def to_masked_dict(self) -> dict:
        """``to_dict`` with every secret masked (``worker.contract.redact``): what may be printed or kept."""
        return redact.masked(self.to_dict(), self.secrets)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerJobSpec(kinds.Trainer, JobSpec):
    """A job of the built-in trainer: the task, its data, the optimizer and the schedule."""

    task: sections.Task = setting(sections.Task())
    data: sections.Data = setting(sections.Data())
    optimizer: sections.Optimizer = setting(sections.Optimizer())
    train: sections.Train = setting(doc="required unless program is given")

    def epoch_text(self) -> str:
        """How many rows each epoch uses, and what happens to the rest, in words."""
        rows, batch = self.data_rows, self.train.global_batch_size
        whole, rest = divmod(rows, batch)
        text = f"data: {rows} rows, global_batch_size {batch}: "
        if self.data.path and not datafiles.values_checked(self.data.path):
            text = (f"data: {rows} rows (a file too large to check before start: its values are "
                    f"checked by the workers as they read them), global_batch_size {batch}: ")

        def batches(n: int) -> str:  # "1 batch per epoch uses", "2 batches per epoch use"
            return f"{n} batch per epoch uses" if n == 1 else f"{n} batches per epoch use"

        if not rest:
            return text + f"{batches(whole)} every row"
        if self.data.last_batch == "pad":
            return (text + f"{batches(whole + 1).rsplit(' ', 1)[0]}; the last one's {rest} rows are "
                    f"padded with {batch - rest} rows from the start (data.last_batch: pad)")
        return (text + f"{batches(whole)} {whole * batch} rows; the last {rest} rows "
                "are never used (data.last_batch: drop; set it to pad to use them)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProgramJobSpec(kinds.Program, JobSpec):
    """A job of the user's own program as every process's worker (``launcher.spec.programspec``)."""

    program: ProgramSpec = setting(doc="run your own program instead of the trainer: "
                                   "docs/programs.md")


SECTION_ORDER = ("name", "task", "data", "optimizer", "train", "program", "logging", "distributed",
                 "checkpoint", "restarts", "watchdog", "profile", "notify", "cluster", "secrets")


def _read(path: str, flag: str | None = None, texts: dict | None = None) -> tuple[Any, dict]:
    """The settings of the YAML file ``path`` and their lines; ``texts``: the files' texts by
    path, read instead of the file where it holds ``path`` (the job recorded at a run's
    start), else given what was read (recorded)."""
    try:
        if texts is not None and isinstance(texts.get(path), str):
            text = texts[path]
        else:
            with open(path, "r", encoding="utf-8") as f:
                text = f.read()
            if texts is not None:
                texts[path] = text
    except OSError as exc:
        where = f"{flag} {path}" if flag else path
        raise SpecError([Problem(where, None, "", f"cannot read: {exc.strerror}; "
                                 "check the path")]) from None
    except UnicodeDecodeError as exc:
        where = f"{flag} {path}" if flag else path
        raise SpecError([Problem(where, None, "", f"not UTF-8 text (byte {exc.start}); "
                                 "a spec is a YAML text file")]) from None
    value, lines = yamlio.load(text, path)
    if value is None:
        raise SpecError([Problem(path, None, "", "the file is empty; expected a mapping of settings")])
    if not isinstance(value, dict):
        raise SpecError([Problem(path, 1, "", f"expected a mapping of settings at the top, "
                                 f"got {schema.describe(value)}")])
    # "x-" keys at the top hold YAML anchors for merges (the Compose convention); not settings
    return {k: v for k, v in value.items() if not k.startswith(EXTENSION_PREFIX)}, lines


# Settings that are local paths: in a spec file relative to the file, on the command line
# (--set) relative to the shell's directory, as every other path given there
SHELL_PATHS = (("data", "path"), ("program", "dir"))


def parse_override(text: str) -> tuple[tuple, Any]:
    """Split ``--set train.num_steps=50`` into (('train', 'num_steps'), 50).

    A number keeps its text as written for settings that pass values exactly
    (``cluster.env``): see ``override_texts``.

    Raises:
      SpecError: no '=', or an empty key.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip() or any(not p for p in key.strip().split(".")):
        raise SpecError([Problem("--set", None, "", f"expected KEY=VALUE with a dotted KEY "
                                 f"(e.g. train.num_steps=50), got {text!r}")])
    try:
        value = yamlio.load_scalar(raw)
    except SpecError as exc:
        if yamlio.secret_path(tuple(key.strip().split("."))):  # YAML's words quote the value
            raise SpecError([Problem("--set", None, key, (
                "its value is not valid YAML (not shown: the key is a secret); quote it: "
                f"--set '{key}=\"...\"'"))]) from None
        raise SpecError([Problem("--set", None, key, p.message) for p in exc.problems]) from None
    return tuple(key.strip().split(".")), value


def load(path: str, cluster_path: str | None = None, overrides: tuple[str, ...] = (), *,
         registry, texts: dict | None = None) -> JobSpec:
    """Read, merge, validate and freeze a job spec.

    Args:
      path: the job YAML file.
      cluster_path: optional cluster YAML; replaces the job's ``cluster:`` section.
        Its top level is the cluster mapping itself (a ``cluster:`` wrapper is accepted).
      overrides: ``KEY=VALUE`` strings from ``--set``, applied last, in order.
      registry: the backends, by ``cluster.backend`` (``names()`` and ``cluster_type(name)``:
        ``launcher.backends``, which the CLI hands in). Spec loading knows no backend of its
        own and imports none: the registry stands on a floor above it.
      texts: the spec files' texts by path: a file it holds is read from it (the job
        recorded at a run's start, ``launcher.rundir.jobrecord``), one it does not is read
        from disk and its text added (recorded); None: the files as they are.

    Returns:
      The frozen JobSpec, with ``data.path`` made absolute.

    Raises:
      SpecError: listing every problem found (nothing has been started).
    """
    raw, lines = _read(path, texts=texts)
    sources: dict = {}
    if cluster_path is not None:
        cluster_raw, cluster_lines = _read(cluster_path, "--cluster", texts)
        prefix = ()
        if set(cluster_raw) == {"cluster"}:
            cluster_raw, prefix = cluster_raw["cluster"], ("cluster",)
        raw["cluster"] = cluster_raw
        merged = yamlio.Lines({k: v for k, v in lines.items() if k[:1] != ("cluster",)})
        merged.texts = {k: v for k, v in lines.texts.items() if k[:1] != ("cluster",)}
        for mine, theirs in ((merged, cluster_lines), (merged.texts, cluster_lines.texts)):
            mine.update({("cluster",) + k[len(prefix):]: v for k, v in theirs.items()
                         if k[:len(prefix)] == prefix})
        lines = merged
        sources[("cluster",)] = cluster_path
    problems: list[Problem] = []
    for text in overrides:
        try:
            keys, value = parse_override(text)
        except SpecError as exc:
            problems += exc.problems
            continue
        node = raw
        for i, key in enumerate(keys[:-1]):
            if not isinstance(node.get(key), dict):
                if key in node:
                    problems.append(Problem("--set", None, ".".join(keys[:i + 1]),
                                            f"is not a mapping, so {'.'.join(keys)} cannot be set"))
                    break
                node[key] = {}
                sources[keys[:i + 1]] = "--set"  # errors under a section --set made name --set
            node = node[key]
        else:
            if keys in SHELL_PATHS and isinstance(value, str) and value.strip():
                # a path on the command line is the shell's, as every other one there is
                value = os.path.abspath(os.path.expanduser(value))
            node[keys[-1]] = value
            sources[keys] = "--set"
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                lines.texts[keys] = text.partition("=")[2].strip()
    if problems:
        raise SpecError(problems)

    ctx = schema.Context(lines, sources, path)
    cluster_raw = raw.pop("cluster", None)
    kind = programspec.job_type(raw, ctx, TrainerJobSpec, ProgramJobSpec)
    spec = MISSING if kind is None else schema.build(kind, raw, (), ctx)
    cluster = _build_cluster(cluster_raw, ctx, registry)
    if spec is not MISSING and cluster is not MISSING:
        task = getattr(spec, "task", None)  # a trainer's: its arguments, each where it was set
        late = LATE_CHECKED + tuple(("task", "args", arg) for arg in (task.args if task else ()))
        spec = dataclasses.replace(spec, cluster=cluster, source=path,
                                   locations={key: ctx.where(key) for key in late})
        spec = crosschecks.check_job(spec, raw, ctx)
    if ctx.problems:
        raise SpecError(in_file_order(ctx.problems))
    return spec


def in_file_order(problems: list) -> list:
    """``problems`` as a reader meets them: each source in the order it first appears, by line
    within it (the ones without a line after, as found)."""
    first = {}
    for p in problems:
        first.setdefault(p.source, len(first))
    return sorted(problems, key=lambda p: (first[p.source], p.line is None, p.line or 0))


def _build_cluster(raw: Any, ctx: schema.Context, registry) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        ctx.error(("cluster",), f"expected a mapping of settings, got {schema.describe(raw)}")
        return MISSING
    backend = raw.get("backend", "local")
    cls = registry.cluster_type(backend) if isinstance(backend, str) else None
    if cls is None:
        schema.convert(Literal[registry.names()], backend, ("cluster", "backend"), ctx)
        return MISSING
    for key in ("hosts", "spares"):  # a plain name is short for {host: name}
        if isinstance(raw.get(key), list):
            raw = {**raw, key: [{"host": h} if isinstance(h, str) else h for h in raw[key]]}
    cluster = schema.build(cls, raw, ("cluster",), ctx)
    if cluster is MISSING:
        return MISSING
    problems = cluster.problems()
    for key, message in problems:
        ctx.error(("cluster",) + (key if isinstance(key, tuple) else (key,)), message)
    return MISSING if problems else cluster


# Keys checked after loading, for one backend only (task importable, memory, the coordinator
# port free).
LATE_CHECKED = (("task", "name"), ("task", "args"), ("data", "num_examples"),
                ("cluster", "hosts", 0), ("cluster", "env", "PYTHONPATH"),
                ("cluster", "coordinator_port"), ("program", "argv"),
                # what names a TPU: a placeholder left there is refused with its line
                ("cluster", "tpu"), ("cluster", "slices"), ("cluster", "queued_resource"),
                ("cluster", "project"), ("cluster", "user"), ("cluster", "backend"))
