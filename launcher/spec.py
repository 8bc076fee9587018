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
import importlib.util
import os
import re
from typing import Any, Literal

from launcher import datafiles, schema, yamlio
from launcher.errors import Problem, SpecError
from launcher.schema import MISSING, non_negative, port_or_zero, positive, setting

BUILTIN_TASKS = ("linear_regression",)
_TASK_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _task_name(value: str) -> str | None:
    if value in BUILTIN_TASKS or _TASK_REF.match(value):
        return None
    return (f"expected a built-in task ({', '.join(BUILTIN_TASKS)}) or 'package.module:function', "
            f"got {value!r}")


def _job_name(value: str) -> str | None:
    if _NAME.match(value):
        return None
    return f"expected letters, digits, '_', '.', '-' (it names the run directory), got {value!r}"


def _env_name(env: dict) -> str | None:
    bad = [k for k in env if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)]
    return f"expected environment variable names, got {bad}" if bad else None


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
    seed: int = setting(1, check=non_negative, doc="synthetic: seed of the data and of w_true")
    path: str | None = setting(None, doc="file: .npy, .npz or .csv, relative to the spec file")
    target_column: int = setting(-1, doc="file (.npy, .csv): index of the target column")


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
    seed: int = setting(0, check=non_negative, doc="seed of the parameter initialisation")


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
class LocalCluster:
    """Single-host debug mode: every process on this machine, CPU devices."""

    backend: Literal["local"] = setting("local", doc="local, ssh or tpu")
    num_processes: int = setting(2, check=schema.in_range(1, 256), doc="worker processes to start")
    devices_per_process: int = setting(2, check=schema.in_range(1, 256),
                                       doc="CPU devices each process sees (JAX_NUM_CPU_DEVICES)")
    coordinator_port: int = setting(0, check=port_or_zero,
                                    doc="JAX coordinator port on 127.0.0.1; 0 picks a free one")
    grace_s: float = setting(3.0, check=non_negative,
                             doc="after SIGTERM, wait this long before SIGKILL")
    env: dict[str, schema.EnvValue] = setting({}, check=_env_name, doc="extra environment for every worker")

    @property
    def platform(self) -> str:
        return "cpu"

    @property
    def num_processes_total(self) -> int:
        return self.num_processes


def _non_empty_hosts(hosts: tuple) -> str | None:
    return None if hosts else "expected at least one host (a name, an address, or a mapping with host:)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SshHost:
    """One SSH host; unset fields fall back to the cluster's, then ~/.ssh/config."""

    host: str = setting(check=schema.non_empty, doc="host name (or ssh_config alias) or address")
    user: str | None = setting(None, doc="login user (default: cluster.user)")
    port: int | None = setting(None, check=schema.in_range(1, 65535), doc="sshd port (default: cluster.port)")
    num_processes: int | None = setting(None, check=schema.in_range(1, 256),
                                        doc="worker processes on this host (default: cluster.processes_per_host)")
    workdir: str | None = setting(None, doc="remote working directory (default: cluster.workdir)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SshSettings:
    """How to reach and run on hosts over SSH; shared by the ssh and tpu clusters."""

    user: str | None = setting(None, doc="login user; unset: ssh_config, then the local user")
    port: int | None = setting(None, check=schema.in_range(1, 65535), doc="sshd port; unset: ssh_config, then 22")
    identity_file: str | None = setting(None, doc="private key tried first; ssh_config's and ssh-agent's keys follow")
    ssh_config_file: str = setting("~/.ssh/config", doc="OpenSSH client config read for every host")
    known_hosts_file: str | None = setting(None, doc="unset: ssh_config UserKnownHostsFile, then ~/.ssh/known_hosts")
    host_key_policy: Literal["strict", "accept-new"] | None = setting(
        None, doc="strict refuses unknown hosts; accept-new records them; a changed key is always refused; "
        "unset: ssh_config StrictHostKeyChecking accept-new, else strict")
    connect_timeout_s: int | None = setting(None, check=positive,
                                            doc="TCP connect + handshake; unset: ssh_config ConnectTimeout, then 10")
    keepalive_interval_s: float = setting(2.0, check=positive, doc="seconds between keepalive requests")
    keepalive_timeout_s: float = setting(15.0, check=positive,
                                         doc="a host that answers no keepalive for this long is lost")
    max_parallel: int = setting(32, check=schema.in_range(1, 1024), doc="hosts contacted at once")
    workdir: str = setting("podlaunch", doc="remote working directory (relative paths: from the login home)")
    python: str = setting("python3", check=schema.non_empty,
                          doc="remote python that runs the worker (sshd's PATH is minimal: prefer an absolute path)")
    setup: tuple[str, ...] = setting((), doc="shell commands run on each host before the worker (not quoted)")
    sync_dir: str | None = setting(None, doc="local directory synced into each host's workdir before start")
    grace_s: float = setting(5.0, check=non_negative, doc="after SIGTERM, wait this long before SIGKILL")
    env: dict[str, schema.EnvValue] = setting({}, check=_env_name, doc="extra environment for every worker")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SshCluster(SshSettings):
    """Real hosts over SSH (``launcher.backends.ssh``); see docs/ssh.md."""

    backend: Literal["ssh"] = setting("ssh", doc="local, ssh or tpu")
    hosts: tuple[SshHost, ...] = setting(check=_non_empty_hosts,
                                         doc="hosts in process order; host 0 runs the coordinator")
    processes_per_host: int = setting(1, check=schema.in_range(1, 256), doc="worker processes per host")
    devices_per_process: int = setting(1, check=schema.in_range(1, 256),
                                       doc="devices each process sees (cpu: JAX_NUM_CPU_DEVICES)")
    platform: Literal["cpu", "gpu", "tpu"] = setting("cpu", doc="the platform the workers must report")
    coordinator_port: int = setting(0, check=port_or_zero,
                                    doc="JAX coordinator port on host 0; 0 picks a free one there")

    def processes_on(self, host: SshHost) -> int:
        return host.num_processes or self.processes_per_host

    @property
    def num_processes_total(self) -> int:
        return sum(self.processes_on(h) for h in self.hosts)


def _accelerator_type(value: str) -> str | None:
    from launcher import tpu_topology  # no cycle: tpu_topology imports nothing of ours
    return tpu_topology.check_accelerator_type(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TpuCluster(SshSettings):
    """Cloud TPU VM slices, discovered with gcloud, run over SSH; see docs/tpu.md.

    One process per TPU VM host; process_id = slice_index x hosts_per_slice +
    worker_index (the order JAX's own TPU cluster detection uses).
    """

    backend: Literal["tpu"] = setting("tpu", doc="local, ssh or tpu")
    tpu: str | None = setting(None, doc="name of one TPU slice")
    slices: tuple[str, ...] = setting((), doc="names of several TPU slices (multislice), in slice order")
    queued_resource: str | None = setting(None, doc="name of a queued resource; its slices, in order")
    zone: str = setting(check=schema.non_empty, doc="the TPU's zone, e.g. us-central2-b")
    project: str | None = setting(None, doc="GCP project; unset: gcloud's configured project")
    accelerator_type: str = setting(check=_accelerator_type,
                                    doc="e.g. v4-32; checked against gcloud; gives hosts and chips per slice")
    num_slices: int | None = setting(None, check=schema.in_range(1, 1024),
                                     doc="queued_resource only: slices it holds (default 1)")
    ip: Literal["internal", "external"] = setting(
        "internal", doc="connect to networkEndpoints[].ipAddress (internal) or .accessConfig.externalIp")
    identity_file: str | None = setting("~/.ssh/google_compute_engine",
                                        doc="private key tried first (gcloud's key); used only if it exists")
    platform: Literal["cpu", "gpu", "tpu"] = setting("tpu", doc="the platform the workers must report")
    local_device_count: int | None = setting(
        None, check=schema.in_range(1, 256),
        doc="devices each host's process sees; unset: JAX devices per host of accelerator_type")
    coordinator_port: int | None = setting(
        None, check=port_or_zero,
        doc="JAX coordinator port on slice 0 worker 0; unset: JAX's TPU default for the hosts' jax "
        "(8482 since jax 0.8.1, 8476 before); 0 picks a free one")
    megascale_port: int = setting(8080, check=schema.in_range(1, 65535),
                                  doc="multislice: MEGASCALE_PORT, the DCN port between slices")
    cluster_detection_method: Literal["deactivate", "gcetpu"] = setting(
        "deactivate", doc="deactivate: the launcher gives every process its id; gcetpu: JAX reads it "
        "from TPU metadata (the worker still checks it against the plan)")
    stop_other_tpu_holders: bool = setting(
        False, doc="also stop processes not started by podlaunch that hold the TPU devices")
    tpu_device_paths: tuple[str, ...] = setting(("/dev/accel*", "/dev/vfio/*"),
                                                doc="globs of the TPU device files checked for holders")
    libtpu_lockfile: str = setting("/tmp/libtpu_lockfile",
                                   doc="libtpu's lock file; removed when stale (no holder left)")
    gcloud: str = setting("gcloud", check=schema.non_empty, doc="the gcloud CLI (found on PATH)")
    gcloud_timeout_s: float = setting(60.0, check=positive, doc="each gcloud call must answer within this")

    def problems(self) -> list:
        """Cross-field problems as (key, message) pairs."""
        given = [k for k in ("tpu", "slices", "queued_resource") if getattr(self, k)]
        out = []
        if len(given) != 1:
            out.append(("tpu", "expected exactly one of tpu (one slice), slices (a list) or "
                        f"queued_resource, got {', '.join(given) if given else 'none'}"))
        if self.num_slices is not None and not self.queued_resource:
            out.append(("num_slices", f"only used with queued_resource; the slice count is "
                        f"{max(1, len(self.slices))} here; remove it"))
        if len(set(self.slices)) != len(self.slices):
            out.append(("slices", f"names a slice twice: {list(self.slices)}"))
        return out

    @property
    def slice_count(self) -> int:
        return len(self.slices) or self.num_slices or 1

    @property
    def hosts_per_slice(self) -> int:
        from launcher import tpu_topology
        return tpu_topology.topology(self.accelerator_type).hosts

    @property
    def devices_per_process(self) -> int:
        from launcher import tpu_topology
        return self.local_device_count or tpu_topology.topology(self.accelerator_type).devices_per_host

    @property
    def num_processes_total(self) -> int:
        return self.slice_count * self.hosts_per_slice


CLUSTERS = {"local": LocalCluster, "ssh": SshCluster, "tpu": TpuCluster}


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A validated job. ``source`` is the spec file it came from."""

    name: str = setting(check=_job_name, doc="job name; names the run directory")
    task: TaskSpec = setting(TaskSpec())
    data: DataSpec = setting(DataSpec())
    optimizer: OptimizerSpec = setting(OptimizerSpec())
    train: TrainSpec = setting()
    logging: LoggingSpec = setting(LoggingSpec())
    distributed: DistributedSpec = setting(DistributedSpec())
    checkpoint: CheckpointSpec = setting(CheckpointSpec())
    restarts: RestartSpec = setting(RestartSpec())
    watchdog: WatchdogSpec = setting(WatchdogSpec())
    cluster: Any = setting(LocalCluster(), doc="where it runs; see the cluster reference")
    source: str = dataclasses.field(default="", compare=False, metadata={"internal": True})
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

    def where(self, key: tuple) -> tuple:
        """(file or ``--set``, line or None) that set ``key`` (one of ``LATE_CHECKED``)."""
        return self.locations.get(key, (self.source, None))

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.pop("source")
        out.pop("locations")
        return out


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
    return value, lines


def parse_override(text: str) -> tuple[tuple, Any]:
    """Split ``--set train.num_steps=50`` into (('train', 'num_steps'), 50).

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
        if set(cluster_raw) == {"cluster"}:
            cluster_raw = cluster_raw["cluster"]
            cluster_lines = {k[1:]: v for k, v in cluster_lines.items() if k[:1] == ("cluster",)}
        raw["cluster"] = cluster_raw
        lines = {k: v for k, v in lines.items() if k[:1] != ("cluster",)}
        lines.update({("cluster",) + k: v for k, v in cluster_lines.items()})
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
    if problems:
        raise SpecError(problems)

    ctx = schema.Context(lines, sources, path)
    cluster_raw = raw.pop("cluster", None)
    spec = schema.build(JobSpec, raw, (), ctx)
    cluster = _build_cluster(cluster_raw, ctx)
    if spec is not MISSING and cluster is not MISSING:
        spec = dataclasses.replace(spec, cluster=cluster, source=path,
                                   locations={key: ctx.where(key) for key in LATE_CHECKED})
        spec = _check_job(spec, raw, ctx)
    if ctx.problems:
        raise SpecError(ctx.problems)
    return spec


def _build_cluster(raw: Any, ctx: schema.Context) -> Any:
    if raw is None:
        return LocalCluster()
    if not isinstance(raw, dict):
        ctx.error(("cluster",), f"expected a mapping of settings, got {schema.describe(raw)}")
        return MISSING
    backend = raw.get("backend", "local")
    cls = CLUSTERS.get(backend) if isinstance(backend, str) else None
    if cls is None:
        schema.convert(Literal[tuple(CLUSTERS)], backend, ("cluster", "backend"), ctx)
        return MISSING
    if isinstance(raw.get("hosts"), list):  # a plain name is short for {host: name}
        raw = {**raw, "hosts": [{"host": h} if isinstance(h, str) else h for h in raw["hosts"]]}
    cluster = schema.build(cls, raw, ("cluster",), ctx)
    if cluster is not MISSING and hasattr(cluster, "problems"):
        for key, message in cluster.problems():
            ctx.error(("cluster", key), message)
        if cluster.problems():
            return MISSING
    return cluster


def _check_job(spec: JobSpec, raw: dict, ctx: schema.Context) -> JobSpec:
    """Cross-field checks: batch over devices, data source settings, data files."""
    train, data = spec.train, spec.data
    if train.global_batch_size % spec.device_count:
        ctx.error(("train", "global_batch_size"),
                  f"{train.global_batch_size} does not divide evenly over device_count "
                  f"{spec.device_count} ({spec.num_processes} processes x "
                  f"{spec.local_device_count} devices); use a multiple of {spec.device_count}")
    raw_data = raw.get("data") or {}
    if data.source == "synthetic":
        if data.path is not None:
            ctx.error(("data", "path"), "only used with data.source: file; set data.source: file "
                      "or remove data.path")
        if data.num_examples < train.global_batch_size:
            ctx.error(("data", "num_examples"),
                      f"{data.num_examples} rows cannot fill one global batch of "
                      f"{train.global_batch_size}; raise it or lower train.global_batch_size")
        return spec
    for key in ("num_examples", "in_features", "out_features", "noise_std", "seed"):
        if schema.given(raw_data, key):
            ctx.error(("data", key), "only used with data.source: synthetic; remove it")
    if data.path is None:
        ctx.error(("data", "path"), "missing; data.source: file needs a path to a .npy, .npz or .csv")
        return spec
    base = os.path.dirname(os.path.abspath(spec.source))
    full = os.path.normpath(os.path.join(base, os.path.expanduser(data.path)))
    if not os.path.exists(full):
        ctx.error(("data", "path"), f"no such file: {full} (paths are relative to the spec file)")
        return spec
    try:
        rows, columns = datafiles.shape(full)
    except datafiles.DataFileError as exc:
        ctx.error(("data", "path"), f"{full}: {exc}")
        return spec
    if not full.endswith(".npz") and not -columns <= data.target_column < columns:
        ctx.error(("data", "target_column"),
                  f"expected a column index from {-columns} to {columns - 1}, got {data.target_column}")
    if rows < train.global_batch_size:
        ctx.error(("train", "global_batch_size"),
                  f"{train.global_batch_size} is more than the {rows} rows of {full}; lower it")
    return dataclasses.replace(spec, data=dataclasses.replace(data, path=full))


# Keys checked after loading, for one backend only (task importable, memory).
LATE_CHECKED = (("task", "name"), ("data", "num_examples"))


def check_fits_in_memory(spec: JobSpec, memory_bytes: int | None = None) -> None:
    """For local runs: synthetic data that cannot fit in this machine's memory is refused.

    Every process holds its rows of every global batch twice (numpy, and the
    copy on its CPU devices: ``worker.train.place``), so the processes on this
    machine together need ``2 x rows x (in_features + out_features) x 4`` bytes,
    rows being the ``num_examples`` that fill whole global batches.

    Raises:
      SpecError: that exceeds 80% of the machine's memory (``memory_bytes``,
        default the physical memory from ``sysconf``).
    """
    data = spec.data
    if data.source != "synthetic":
        return
    if memory_bytes is None:
        memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    rows = data.num_examples // spec.train.global_batch_size * spec.train.global_batch_size
    need = 2 * rows * (data.in_features + data.out_features) * 4
    if need > 0.8 * memory_bytes:
        gib = 1 << 30
        raise SpecError([Problem(*spec.where(("data", "num_examples")), "data.num_examples",
                                 f"{rows} rows x {data.in_features + data.out_features} float32 "
                                 f"columns need about {need / gib:.1f} GiB here (every process "
                                 f"holds its rows twice), more than 80% of this machine's "
                                 f"{memory_bytes / gib:.1f} GiB; lower data.num_examples or "
                                 "data.in_features")])


def check_task_importable(spec: JobSpec) -> None:
    """For local runs: a user task's module must be findable (it is not imported here).

    Raises:
      SpecError: the module cannot be found on this machine's sys.path.
    """
    if spec.task.name in BUILTIN_TASKS:
        return
    module = spec.task.name.split(":")[0]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise SpecError([Problem(*spec.where(("task", "name")), "task.name",
                                 f"module {module!r} is not importable here; install it or add its "
                                 "directory to PYTHONPATH")])
