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
import re
from typing import Any, Literal

from launcher import backends, crosschecks, schema, yamlio
from launcher.checks import BUILTIN_TASKS
from launcher.errors import Problem, SpecError
from launcher.programspec import ProgramSpec
from launcher.schema import MISSING, non_negative, positive, setting
from worker import redact

_TASK_REF = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def _task_name(value: str) -> str | None:
    if value in BUILTIN_TASKS or _TASK_REF.fullmatch(value):
        return None
    return (f"expected a built-in task ({', '.join(BUILTIN_TASKS)}) or 'package.module:function', "
            f"got {value!r}")


EXTENSION_PREFIX = "x-"

_job_name = schema.identifier("a job name", _NAME.pattern,
                              "letters, digits, '_', '.', '-', at most 128; it names the run directory",
                              r"[A-Za-z0-9_.-]")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSpec:
    name: str = setting("linear_regression", check=_task_name,
                        doc="built-in task, or 'package.module:function' returning a worker.tasks.Task")
    args: dict[str, Any] = setting({}, doc="keyword arguments passed to the task's function")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSpec:
    source: Literal["synthetic", "file"] = setting("synthetic", doc="synthetic or file")
    num_examples: int = setting(256, check=positive, doc="synthetic: rows in the dataset")
    in_features: int = setting(4, check=positive, doc="synthetic: features per row")
    out_features: int = setting(1, check=positive, doc="synthetic: targets per row")
    noise_std: float = setting(0.1, check=non_negative,
                               doc="synthetic: std of the Gaussian noise added to x @ w_true + b_true")
    seed: int = setting(1, check=schema.seed, doc="synthetic: seed of the data and of w_true")
    path: str | None = setting(None, check=schema.LOCAL_PATH,
                               doc="file: .npy, .npz or .csv, relative to the spec file")
    target_column: int = setting(-1, check=schema.index,
                                 doc="file (.npy, .csv): index of the target column")
    last_batch: Literal["drop", "pad"] = setting(
        "drop", doc="rows that do not fill a last global batch: drop them, or pad that batch "
        "with rows from the start (the launch says how many rows each epoch uses)")
    shuffle: bool = setting(False, doc="a seeded permutation of the rows for every epoch, the same "
                            "global order on every topology")
    shuffle_seed: int = setting(0, check=schema.seed, doc="seed of the shuffle")
    prefetch: int = setting(2, check=positive, doc="device calls' batches each process reads and "
                            "places ahead of the step (host and device memory: about this many "
                            "batches)")
    resident: bool = setting(False, doc="unshuffled data that fits in device memory: keep every "
                             "batch on the devices after its first use (no reads or copies per "
                             "step, as before streaming)")
    target_dtype: Literal["float32", "int32"] = setting(
        "float32", doc="file (.npy, .csv): the target column as float32 targets, or int32 class "
        "labels (whole numbers)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerSpec:
    name: Literal["sgd", "adam", "adamw"] = setting("sgd", doc="optax optimizer")
    learning_rate: float = setting(0.01, check=positive, doc="step size")
    momentum: float | None = setting(None, check=schema.in_range(0.0, 1.0),
                                     doc="sgd only: heavy-ball momentum (None = plain SGD)")
    weight_decay: float = setting(1e-4, check=non_negative, doc="adamw only")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSpec:
    num_steps: int = setting(check=positive, doc="optimizer steps to run")
    global_batch_size: int = setting(check=positive,
                                     doc="examples per step over all devices; must divide by device_count")
    seed: int = setting(0, check=schema.seed, doc="seed of the parameter initialisation")
    steps_per_call: int = setting(
        1, check=schema.in_range(1, 100000),
        doc="optimizer steps per device call (a lax.scan inside the mapped step): small steps "
        "are dispatch-bound, so k > 1 runs faster with the same params; num_steps, "
        "checkpoint.every_steps and logging.log_every_steps must be multiples of it")
    allreduce: Literal["packed", "per_leaf"] = setting(
        "packed", doc="packed: gradients and loss averaged in one flat buffer per dtype, one "
        "collective per step (faster across processes); per_leaf: one pmean per array, as the seed")
    parallelism: Literal["pmap", "jit"] = setting(
        "pmap", doc="pmap: jax.pmap over the local devices, params replicated per device (the "
        "seed's step; the default while jit is not measured faster: README, Benchmarks); jit: "
        "jax.jit over a global Mesh of every device, the batch sharded with NamedSharding, params "
        "replicated, the same per-device step inside (same params)")
    compilation_cache: bool = setting(
        True, doc="JAX's persistent compilation cache, shared by every process and attempt of "
        "the run, so a restart loads what was compiled: runs/<job>/compilation-cache for a run in "
        "the default layout (runs/<job>/<run>), shared by every run of the job, so a re-run "
        "loads it too; <run dir>/compilation-cache for a --run-dir elsewhere; false: every "
        "attempt compiles")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoggingSpec:
    log_every_steps: int = setting(10, check=positive,
                                   doc="print progress and write TensorBoard scalars every N steps")
    tensorboard: bool = setting(True, doc="process 0 writes TensorBoard events and metrics.jsonl "
                                "to <run dir>/tensorboard")
    on_nonfinite_loss: Literal["stop", "warn"] = setting(
        "stop", doc="a NaN or infinite loss at a log step: stop the run (naming the step) or warn and go on")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedSpec:
    initialization_timeout_s: int = setting(60, check=positive,
                                            doc="jax.distributed.initialize: wait this long for all processes")
    heartbeat_timeout_s: int = setting(30, check=positive,
                                       doc="JAX's coordination service declares a silent process dead after this")


def _exit_codes(codes: tuple) -> str | None:
    bad = [c for c in codes if not 1 <= c <= 255]
    return f"expected exit codes 1 to 255, got {bad}" if bad else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointSpec:
    every_steps: int = setting(1000, check=non_negative,
                               doc="process 0 saves params, optimizer state, step and data position "
                               "every N steps and at the last step (0 = never)")
    keep: int = setting(3, check=schema.in_range(1, 1000), doc="checkpoints kept (the newest)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RestartSpec:
    max_restarts: int = setting(0, check=schema.in_range(0, 1000),
                                doc="relaunches after a retryable failure, from the latest checkpoint")
    backoff_s: float = setting(5.0, check=non_negative,
                               doc="wait before the first restart; doubles after each restart")
    retry_exit_codes: tuple[int, ...] = setting(
        (143, 137), check=_exit_codes,
        doc="worker exit codes that are retried (143/137: SIGTERM/SIGKILL as a shell reports them); "
        "deaths by a signal, stalls and lost hosts are always retried; "
        "exit 1 (a Python error) is not unless listed")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WatchdogSpec:
    stall_timeout_s: float | None = setting(
        300.0, check=positive,
        doc="a process alive but without step progress this long is a failure (null = off)")
    first_step_timeout_s: float | None = setting(
        900.0, check=positive,
        doc="allowance from start to the first completed step: imports, joining, data, "
        "compilation (null = off)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A validated job. ``source`` is the spec file it came from."""

    name: str = setting(check=_job_name, doc="job name; names the run directory")
    task: TaskSpec = setting(TaskSpec())
    data: DataSpec = setting(DataSpec())
    optimizer: OptimizerSpec = setting(OptimizerSpec())
    train: TrainSpec | None = setting(None, doc="required unless program is given")
    program: ProgramSpec | None = setting(None, doc="run your own program instead of the trainer")
    logging: LoggingSpec = setting(LoggingSpec())
    distributed: DistributedSpec = setting(DistributedSpec())
    checkpoint: CheckpointSpec = setting(CheckpointSpec())
    restarts: RestartSpec = setting(RestartSpec())
    watchdog: WatchdogSpec = setting(WatchdogSpec())
    cluster: Any = setting(None, doc="where it runs (default: cluster.backend local); see the "
                           "cluster reference")
    secrets: tuple[str, ...] = setting((), doc="key names (any depth: cluster.env, task.args) whose "
                                       "values are masked in everything printed or written, "
                                       "besides the names worker.redact recognises")
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
        return self.cluster.devices_per_process

    @property
    def device_count(self) -> int:
        return self.num_processes * self.local_device_count

    @property
    def per_device_batch_size(self) -> int:
        return self.train.global_batch_size // self.device_count

    @property
    def is_program(self) -> bool:  # the user's own command runs as each process's worker
        return self.program is not None

    def where(self, key: tuple) -> tuple:
        """(file or ``--set``, line or None) that set ``key`` (one of ``LATE_CHECKED``)."""
        return self.locations.get(key, (self.source, None))

    def epoch_text(self) -> str:
        """How many rows each epoch uses, and what happens to the rest, in words."""
        if self.is_program:
            return f"program: {' '.join(self.program.argv)} (from {self.program.dir})"
        rows, batch = self.data_rows, self.train.global_batch_size
        whole, rest = divmod(rows, batch)
        text = f"data: {rows} rows, global_batch_size {batch}: "

        def batches(n: int) -> str:  # "1 batch per epoch uses", "2 batches per epoch use"
            return f"{n} batch per epoch uses" if n == 1 else f"{n} batches per epoch use"

        if not rest:
            return text + f"{batches(whole)} every row"
        if self.data.last_batch == "pad":
            return (text + f"{batches(whole + 1).rsplit(' ', 1)[0]}; the last one's {rest} rows are "
                    f"padded with {batch - rest} rows from the start (data.last_batch: pad)")
        return (text + f"{batches(whole)} {whole * batch} rows; the last {rest} rows "
                "are never used (data.last_batch: drop; set it to pad to use them)")

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        for internal in ("source", "locations", "data_rows"):
            out.pop(internal)
        return out

    def to_masked_dict(self) -> dict:
        """``to_dict`` with every secret masked (``worker.redact``): what may be printed or kept."""
        return redact.masked(self.to_dict(), self.secrets)


def _read(path: str, flag: str | None = None) -> tuple[Any, dict]:
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
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
        raise SpecError([Problem("--set", None, key, p.message) for p in exc.problems]) from None
    return tuple(key.strip().split(".")), value


def load(path: str, cluster_path: str | None = None, overrides: tuple[str, ...] = ()) -> JobSpec:
    """Read, merge, validate and freeze a job spec.

    Args:
      path: the job YAML file.
      cluster_path: optional cluster YAML; replaces the job's ``cluster:`` section.
        Its top level is the cluster mapping itself (a ``cluster:`` wrapper is accepted).
      overrides: ``KEY=VALUE`` strings from ``--set``, applied last, in order.

    Returns:
      The frozen JobSpec, with ``data.path`` made absolute.

    Raises:
      SpecError: listing every problem found (nothing has been started).
    """
    raw, lines = _read(path)
    sources: dict = {}
    if cluster_path is not None:
        cluster_raw, cluster_lines = _read(cluster_path, "--cluster")
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
            node[keys[-1]] = value
            sources[keys] = "--set"
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                lines.texts[keys] = text.partition("=")[2].strip()
    if problems:
        raise SpecError(problems)

    ctx = schema.Context(lines, sources, path)
    cluster_raw = raw.pop("cluster", None)
    spec = schema.build(JobSpec, raw, (), ctx)
    cluster = _build_cluster(cluster_raw, ctx)
    if spec is not MISSING and cluster is not MISSING:
        spec = dataclasses.replace(spec, cluster=cluster, source=path,
                                   locations={key: ctx.where(key) for key in LATE_CHECKED})
        spec = crosschecks.check_job(spec, raw, ctx)
    if ctx.problems:
        raise SpecError(ctx.problems)
    return spec


def _build_cluster(raw: Any, ctx: schema.Context) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        ctx.error(("cluster",), f"expected a mapping of settings, got {schema.describe(raw)}")
        return MISSING
    backend = raw.get("backend", "local")
    cls = backends.cluster_type(backend) if isinstance(backend, str) else None
    if cls is None:
        schema.convert(Literal[backends.names()], backend, ("cluster", "backend"), ctx)
        return MISSING
    if isinstance(raw.get("hosts"), list):  # a plain name is short for {host: name}
        raw = {**raw, "hosts": [{"host": h} if isinstance(h, str) else h for h in raw["hosts"]]}
    cluster = schema.build(cls, raw, ("cluster",), ctx)
    if cluster is MISSING:
        return MISSING
    problems = cluster.problems()
    for key, message in problems:
        ctx.error(("cluster", key), message)
    return MISSING if problems else cluster


# Keys checked after loading, for one backend only (task importable, memory).
LATE_CHECKED = (("task", "name"), ("data", "num_examples"), ("cluster", "hosts", 0))
