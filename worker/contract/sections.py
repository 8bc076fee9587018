"""The job's sections, declared once for the launcher and the worker (standard library only).

Each section is a frozen dataclass whose fields carry their default, a value check and a
doc line (``setting``). The launcher builds them from YAML (``launcher.spec.schema.build``:
conversion, checks, line numbers) and composes the whole spec from them plus its own
sections (cluster, restarts, program, secrets: ``launcher.spec``); ``job.json`` is their
projection, read back by the worker into the same classes (``worker.contract.job``, every key
required there, each value's type checked on construction: ``worker.contract.fields``). A new
setting is one field here; docs/settings.md's table is rendered from these fields
(``launcher.commands.settings_doc``), so its doc text is the reference a user reads.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

from worker.contract.fields import check_fields
from worker.contract.valuechecks import (LOCAL_PATH, Check, allows, in_range, index,
                                         non_negative, non_negative_value, positive,
                                         positive_value, seed)
from worker.contract.periods import A_ROW, ENDS_A_CALL, NEXT_CALL_END
from worker.contract.tasks import BUILTIN_TASKS  # also read as sections.BUILTIN_TASKS

MISSING = dataclasses.MISSING


def setting(default: Any = MISSING, *, check: Check | None = None, doc: str = "",
            period: str | None = None):
    """A spec field: its default (MISSING = required), a value check, a doc line and, for a
    number of steps that times the loop's work, what that asks of the device calls
    (``worker.contract.periods``)."""
    kwargs: dict[str, Any] = {"metadata": {"check": check, "doc": doc, "period": period}}
    if isinstance(default, (dict, list)):
        kwargs["default_factory"] = (lambda d=default: type(d)(d))
    elif default is not MISSING:
        kwargs["default"] = default
    return dataclasses.field(**kwargs)



_seed = seed  # by another name: in a class body, a field named ``seed`` hides the function

# The tasks worker.tasks builds in: the launcher checks these names, imports nothing
_TASK_REF = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")


def _task_name(value: str) -> str | None:
    if value in BUILTIN_TASKS or _TASK_REF.fullmatch(value):
        return None
    return (f"expected a built-in task ({', '.join(BUILTIN_TASKS)}) or 'package.module:function', "
            f"got {value!r}")



class _Section:
    """A job section: its values' types are checked on construction (``ContractError``)."""

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task(_Section):
    """``task``: which task builds the model and loss (``worker.tasks``), and its arguments."""

    name: str = setting("linear_regression", check=_task_name,
                        doc="a built-in task (linear_regression; softmax_classifier with args {num_classes, "
                        "input_scale}: cross-entropy on integer labels, accuracy logged), or "
                        "'package.module:function' returning a worker.tasks.Task (init params, a loss "
                        "of (params, x, y) or of (params, batch) with the batch a dict of named "
                        "arrays, optional logged metrics and per-step hook)")
    args: dict[str, Any] = setting({}, doc="keyword arguments passed to the task's function")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Data(_Section):
    """``data``: where the rows come from and in which order (``worker.data.batches``, ``worker.data.sources``)."""

    source: Literal["synthetic", "file"] = setting(
        "synthetic", doc="synthetic: y = x @ w_true + b_true + noise, so the optimum is known; "
        "file: a .npy, .npz or .csv (data.path)")
    num_examples: int = setting(256, check=positive, doc="synthetic: rows in the dataset")
    in_features: int = setting(4, check=positive, doc="synthetic: features per row")
    out_features: int = setting(1, check=positive, doc="synthetic: targets per row")
    noise_std: float = setting(0.1, check=non_negative_value,
                               doc="synthetic: std of the Gaussian noise added to x @ w_true + b_true")
    seed: int = setting(1, check=_seed, doc="synthetic: seed of the data and of w_true")
    path: str | None = setting(None, check=LOCAL_PATH,
                               doc="file: .npy, .npz or .csv, relative to the spec file; each "
                               "process reads only its own rows of each batch, when it needs them "
                               "(.npy memory-mapped; .npz: named arrays, x and y for the built-in "
                               "tasks, memory-mapped when saved with numpy.savez; a .csv may start "
                               "with a header line (a line with a cell that is neither a number nor "
                               "a missing-value mark such as NA, NULL or an empty cell: a headerless "
                               "export whose first row misses a value is refused at that row, never "
                               "skipped; a byte-order mark and cells in double quotes, as "
                               "spreadsheets write them, are read), every cell is checked to be a "
                               "number before launch, and it is converted once to a cached .npy in "
                               "the run directory)")
    target_column: int = setting(-1, check=index,
                                 doc="file (.npy, .csv): index of the target column; the others are features")
    last_batch: Literal["drop", "pad"] = setting(
        "drop", doc="rows that do not fill a last global batch: drop them, or pad that batch "
        "with rows from the start (the launch says how many rows each epoch uses)")
    shuffle: bool = setting(False, doc="a seeded permutation of the rows for every epoch, the same "
                            "global order on every topology; the data position is part of the "
                            "checkpoint (docs/data.md)")
    shuffle_seed: int = setting(0, check=_seed, doc="seed of the shuffle")
    prefetch: int = setting(2, check=positive, doc="device calls' batches each process reads and "
                            "places ahead of the step (host and device memory: about this many "
                            "batches)")
    resident: bool = setting(False, doc="unshuffled data that fits in device memory: keep every "
                             "batch on the devices after its first use (no reads or copies per "
                             "step, as before streaming); with few batches (at most prefetch, or "
                             "steps_per_call) that happens anyway")
    target_dtype: Literal["float32", "int32"] = setting(
        "float32", doc="file (.npy, .csv): the target column as float32 targets, or int32 class "
        "labels (whole numbers)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Optimizer(_Section):
    """``optimizer``: the optax optimizer (``worker.trainer.train.make_optimizer``)."""

    name: Literal["sgd", "adam", "adamw"] = setting(
        "sgd", doc="sgd (exactly p - lr * g), adam, adamw (optax)")
    learning_rate: float = setting(0.01, check=positive_value, doc="step size")
    momentum: float | None = setting(None, check=in_range(0.0, 1.0),
                                     doc="sgd only: heavy-ball momentum (null = plain SGD)")
    weight_decay: float = setting(1e-4, check=non_negative_value, doc="adamw only")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Train(_Section):
    """``train``: the schedule and the step (``worker.trainer.train``: pmap; ``worker.trainer.sharded``: jit)."""

    num_steps: int = setting(check=positive, doc="optimizer steps to run", period=ENDS_A_CALL)
    global_batch_size: int = setting(check=positive,
                                     doc="examples per step over all devices; must divide by device_count")
    seed: int = setting(0, check=_seed, doc="seed of the parameter initialisation")
    steps_per_call: int | Literal["auto"] = setting(
        "auto", check=allows("1 to 100000")(lambda v: None if v == "auto" else in_range(1, 100000)(v)),
        doc="optimizer steps per device call (a loop on the device, traced once): small steps "
        "are dispatch-bound, so k > 1 runs faster with the same params; num_steps and "
        "checkpoint.every_steps must be multiples of it; log steps may fall inside a call. "
        "auto: 1 on CPU devices (every step its own call, for debugging); on TPU and GPU devices "
        "the largest divisor of num_steps, checkpoint.every_steps and a resumed run's step, up "
        "to 1,000, whose call is estimated at under 0.1 s (worker/trainer/calls.py; "
        "docs/tpu.md#speed-on-the-chip). Small steps are dispatch-bound: see docs/benchmarks.md")
    allreduce: Literal["packed", "per_leaf"] = setting(
        "packed", doc="packed: gradients and loss averaged in one flat buffer per dtype, one "
        "collective per step (faster across processes; on one device there is nothing to "
        "average, and it is per_leaf); per_leaf: one pmean per array, as a plain pmap script "
        "does (either parallelism)")
    parallelism: Literal["auto", "pmap", "jit"] = setting(
        "auto", doc="pmap: jax.pmap over the local devices, params replicated per device (the "
        "classic data-parallel step); jit: jax.jit over a global Mesh of every device, the batch "
        "sharded along its axis with NamedSharding, params and optimizer state replicated, each "
        "process's rows made global with jax.make_array_from_process_local_data; inside, the "
        "same per-device step under vmap with the axis name, so its pmean is one all-reduce that "
        "XLA's partitioner places (worker/trainer/sharded.py; JAX's recommended path, pmap being in "
        "maintenance mode); auto: pmap, except jit in one process of one device (the same "
        "program, with the cheaper dispatch; on CPU devices XProf's overview page then finds no "
        "steps, its trace viewer has each) and for fused calls (steps_per_call > 1) in one "
        "process or with one device per process, where a lax.scan inside pmap ran up to 16 "
        "times slower. Same params (rtol 1e-6) on every topology and backend; works with "
        "steps_per_call, checkpoints, restarts and the non-finite check. Speed: see "
        "docs/benchmarks.md")
    compilation_cache: bool = setting(
        True, doc="JAX's persistent compilation cache, shared by every process and attempt of "
        "the run, so a restart loads what was compiled: runs/<job>/compilation-cache for a run in "
        "the default layout (runs/<job>/<run>), shared by every run of the job, so a re-run "
        "loads it too; <run dir>/compilation-cache for a --run-dir elsewhere; JAX's own "
        "JAX_COMPILATION_CACHE_DIR, where a worker has it in its environment, instead (each "
        "process reports its hits and misses: docs/benchmarks.md; concurrency and growth: "
        "docs/recovery.md); false: every attempt compiles")



@dataclasses.dataclass(frozen=True, kw_only=True)
class Logging(_Section):
    """``logging``: progress lines, TensorBoard (process 0) and what a non-finite loss does."""

    log_every_steps: int = setting(10, check=positive, period=A_ROW,
                                   doc="print progress and write TensorBoard scalars every N steps")
    tensorboard: bool = setting(True, doc="process 0 writes TensorBoard events and metrics.jsonl "
                                "to <run dir>/tensorboard")
    on_nonfinite_loss: Literal["stop", "warn"] = setting(
        "stop", doc="a NaN or infinite loss at a log step: stop the run (naming the step) or warn and go on")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Distributed(_Section):
    """``distributed``: ``jax.distributed.initialize``'s timeouts, in seconds."""

    initialization_timeout_s: int = setting(60, check=positive,
                                            doc="jax.distributed.initialize waits this long for every process (in "
                                            "all: every process but 0 first waits, within it, for "
                                            "process 0's coordinator port to accept a connection, "
                                            "polled every 20 ms, so none joins on gRPC's reconnect "
                                            "backoff of 1 s and more)")
    heartbeat_timeout_s: int = setting(30, check=positive,
                                       doc="JAX's coordination service declares a silent process dead after this")



@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkpoint(_Section):
    """``checkpoint``: what process 0 saves, how often, how many are kept (``worker.recovery.checkpoint``)."""

    every_steps: int = setting(1000, check=non_negative, period=ENDS_A_CALL,
                               doc="process 0 saves params, optimizer state, step and data position "
                               "every N steps and at the last step (0 = never)")
    keep: int = setting(3, check=in_range(1, 1000), doc="checkpoints kept (the newest)")
    local_every_steps: int = setting(
        100, check=non_negative, period=NEXT_CALL_END,
        doc="every host also keeps the newest state in checkpoint.local_dir every N steps, "
        "no closer than 0.25 s apart (one process per host writes it; the copy off the devices on the step's path, the write in the background; the "
        "newest 2 kept); a restart resumes from the newest step any process or process 0's "
        "checkpoints hold (0 = off; "
        "docs/recovery.md#the-local-tier-every-hosts-own-copy-restored-from-any-survivor)")
    local_dir: str = setting("local-checkpoints", check=LOCAL_PATH,
                             doc="where each host keeps them (process-NNN inside, NNN its "
                             "writer's id), relative to its run directory "
                             "or absolute (a RAM disk such as /dev/shm/NAME where the host has one)")
    notice_grace_s: float = setting(
        25.0, check=non_negative,
        doc="a preemption notice (SIGTERM to any worker or to the launcher, a Slurm "
        "preemption) stops every "
        "process after one agreed step and process 0 saves it, within this many seconds; an "
        "agreement or save that would end later is said and the previous checkpoint is used "
        "(0 = a notice stops at once, no checkpoint; "
        "docs/recovery.md#a-preemption-notice-one-step-agreed-and-saved)")



@dataclasses.dataclass(frozen=True, kw_only=True)
class Profile(_Section):
    """``profile``: ``jax.profiler`` traces of chosen steps from every process, for TensorBoard's
    profile plugin (``worker.telemetry.profiler``); ``launch profile RUN`` asks a live run the same."""

    start_step: int | None = setting(
        None, check=positive,
        doc="the first step of a jax.profiler trace from every process, into "
        "tensorboard/plugins/profile/steps_A-B/process_N.xplane.pb (TensorBoard's Profile tab); "
        "null: none from the spec, launch profile RUN still asks a live run "
        "(docs/monitoring.md#profiles-inside-a-step)")
    num_steps: int = setting(5, check=in_range(1, 10000),
                             doc="steps traced from start_step (and by launch profile without --steps)")
    processes: Literal["all", "slowest"] = setting(
        "all", doc="all: every process keeps its trace; slowest: every process traces, only the "
        "one slowest over the traced steps keeps its own")
    python_tracer: bool = setting(
        False, doc="add host-side Python function tracing (jax.profiler.ProfileOptions."
        "python_tracer_level 1): the host's own code in the trace viewer, at a cost per Python "
        "call while tracing")



@dataclasses.dataclass(frozen=True, kw_only=True)
class Watchdog(_Section):
    """``watchdog``: the launcher's stall timeouts; ``stall_timeout_s`` also paces the
    workers' heartbeats (``wire.heartbeat_interval_s``)."""

    stall_timeout_s: float | None = setting(
        300.0, check=positive,
        doc="a process alive but without step progress this long is a failure (null = off)")
    first_step_timeout_s: float | None = setting(
        900.0, check=positive,
        doc="allowance from start to the first completed step: imports, joining, data, "
        "compilation (null = off)")



@dataclasses.dataclass(frozen=True, kw_only=True)
class ProgramSteps(_Section):
    """``program``'s part the worker reads (``worker.program``): the steps it reports. The
    launcher's ``ProgramSpec`` adds the command, its directory, environment and sync rules."""

    num_steps: int | None = setting(None, check=positive,
                                    doc="steps the program will report (worker.program.report); "
                                    "an exit 0 before it reported the last one is a failure")
