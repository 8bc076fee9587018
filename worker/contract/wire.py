"""The lines a worker prints for its launcher, typed: one class per kind, each knowing its text
(``text()``), and one ``parse(line)`` that the launcher reads every line through.

A worker prints ``Progress`` at every logged step, ``Heartbeat`` at most every
``heartbeat_interval_s`` between them (for the launcher's stall watchdog; the launcher does
not echo them), ``FailedAt`` then ``Failed`` when it dies of an exception, ``Joining`` and
``Joined`` around ``jax.distributed.initialize`` (``InitFailed`` if it raises), ``Resumed``,
``CacheReport`` and ``CheckpointSaved`` as a run goes, ``Facts`` first under Slurm's
rendezvous (``worker.contract.RENDEZVOUS``), ``Done`` last after a complete run, and an
expected failure's traceback between ``DetailBegin`` and ``DetailEnd`` (the log's only).
Every other line is ``Other``; a profile trace's line is ``worker.contract.profiling.Trace``.

``parse`` costs one look at the line's first character for most lines (every line of every
process passes through it), and a regular expression only where the head matches.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from worker.contract import profiling
from worker.contract.metrics import STEP_METRICS

# "step 40/100 loss 0.012345 accuracy 0.9375 | 812.3 steps/s | step_time_s 0.001231 (own
# 0.000402)": the task's own metrics after the loss (a name and a value each, ``Progress.text``
# puts them there), wall seconds per
# step since the last logged step (equal on every process), and own: this process's host work
# outside JAX, what singles out a straggler (worker/telemetry/metrics.py).
PROGRESS_FORMAT = ("step {step}/{num_steps} loss {loss:.6g} | {steps_per_s:.1f} steps/s"
                   " | step_time_s {step_time_s:.6g} (own {own_step_time_s:.6g})")
PROGRESS_RE = re.compile(
    r"^step (?P<step>\d+)/(?P<num_steps>\d+) loss (?P<loss>\S+)(?P<metrics>(?: [^\s|]+ [^\s|]+)*)"
    r" \| (?P<steps_per_s>\S+) steps/s"
    r"(?: \| step_time_s (?P<step_time_s>\S+) \(own (?P<own_step_time_s>\S+)\))?")
SHOWN_METRICS = 4  # a task's or program's own metrics on a step line, at most (the first ones)
HEARTBEAT_FORMAT = "podlaunch-heartbeat step {step}"
RESUMED_FORMAT = "resumed from the checkpoint of step {step} (attempt {attempt}) in {seconds:.3f} s"
CACHE_FORMAT = ("compilation cache: {hits} hits, {misses} misses; first step (trace, compile, "
                "dispatch) {seconds} s ({path})")
CHECKPOINT_FORMAT = "checkpoint of step {step} saved in {seconds:.3f} s: {path}"
JOINING_FORMAT = "joining the coordinator at {address} (initialization_timeout_s {timeout_s:g})"
FAILED_PREFIX = "failed at step "
_FAILED_RE = re.compile(r"^failed at step (?P<step>\d+): ")
# Just before a Failed line: when (time.time(), the host's clock) the worker caught its error; a
# cascade's victims catch theirs after the cause died, so the launcher leads with the earliest.
FAILED_TIME_PREFIX = "podlaunch-failed-at "
_FAILED_TIME_RE = re.compile(r"^podlaunch-failed-at (?P<at>\d+(?:\.\d+)?)$")
DETAIL_BEGIN, DETAIL_END = "traceback of the failure above:", "end of the traceback"  # log only
HEARTBEAT_PREFIX = "podlaunch-heartbeat step "
_HEARTBEAT_RE = re.compile(r"^podlaunch-heartbeat step (?P<step>\d+)$")
# Every process of a resumed attempt, before its first step: the steps before N + 1 were done
# by an earlier attempt, the restore's wall seconds (launcher.rundir.ledger), ": process N's
# local copy" where it came from there
RESUMED_RE = re.compile(r"^resumed from the checkpoint of step (?P<step>\d+) \(attempt (?P<attempt>\d+)\)"
                        r"(?: in (?P<seconds>[0-9.]+) s)?(?:: (?P<source>.*))?$")
# Every process after its first call: JAX's persistent cache's hits and misses (its own
# events) and that call's wall seconds ("?" unknown); the launcher's summary shows them.
CACHE_RE = re.compile(r"^compilation cache: (?P<hits>\d+) hits, (?P<misses>\d+) misses; first step "
                      r"\(trace, compile, dispatch\) (?P<seconds>[0-9.]+|\?) s \((?P<path>.*)\)$")
# Process 0, once a checkpoint is complete (renamed into place), with the save's seconds:
# over ssh the launcher copies it from host 0 to the local run directory when it sees this.
CHECKPOINT_RE = re.compile(r"^checkpoint of step (?P<step>\d+) saved(?: in (?P<seconds>[0-9.]+) s)?: "
                           r"(?P<path>.*)$")
# Around jax.distributed.initialize: Joining before, Joined after. A process that dies in
# between (JAX aborts with SIGABRT when the coordinator cannot be reached within
# initialization_timeout_s; a Python error exits EXIT_INIT after an InitFailed line) failed to
# join: a configuration or network problem that a restart does not fix.
JOINING_RE = re.compile(r"^joining the coordinator at (?P<address>\S+) \(initialization_timeout_s "
                        r"(?P<timeout_s>[0-9.]+)\)$")
JOINED_RE = re.compile(r"^process (?P<process_id>\d+)/(?P<num_processes>\d+) joined (?P<address>.*)$")
INIT_FAILED_PREFIX = "podlaunch-init-failed: "
FACTS_PREFIX = "podlaunch-facts "
# The worker's last line after a complete run. A process that exits 0 without it (and without
# a progress line of its last step) ended early: the launcher counts that as a failure, not a
# success (its peers would wait for it in a collective).
DONE_LINE = "done"


class Progress(NamedTuple):
    """A logged step; times in seconds (None when the line predates them); ``metrics``: the
    task's or program's own scalars at that step besides the loss, ``((name, value), ...)``
    (``accuracy``), at most ``SHOWN_METRICS`` of them on the line."""

    step: int
    num_steps: int
    loss: float
    steps_per_s: float
    step_time_s: float | None = None
    own_step_time_s: float | None = None
    metrics: tuple = ()

    @property
    def finished(self) -> bool:
        return self.step >= self.num_steps

    def text(self) -> str:
        # written for every log step (thousands a second at a fused tiny step): the fields
        # named, not ``_asdict``'s dict, and the metrics' words only where there are some
        line = PROGRESS_FORMAT.format(step=self.step, num_steps=self.num_steps, loss=self.loss,
                                      steps_per_s=self.steps_per_s, step_time_s=self.step_time_s,
                                      own_step_time_s=self.own_step_time_s)
        if not self.metrics:
            return line
        shown = "".join(f" {metric_word(name)} {value:.4g}"
                        for name, value in self.metrics[:SHOWN_METRICS])
        return line.replace(" | ", f"{shown} | ", 1)


def metric_word(name: str) -> str:
    """A metric's name as one word of a step line: blanks and ``|`` made ``_``."""
    return re.sub(r"[\s|]", "_", str(name)) or "_"


def own_metrics(values: dict, names=None) -> tuple:
    """``((name, value), ...)`` of ``values`` (name -> float) other than the loss and the
    step's own norms (``worker.contract.metrics.STEP_METRICS``), in ``names``' order
    (default: ``values``'): what a step line shows after the loss."""
    return tuple((name, values[name]) for name in (values if names is None else names)
                 if name not in STEP_METRICS and name in values)


class Heartbeat(NamedTuple):
    """Progress for the watchdog, noise for people: the step the devices finished."""

    step: int

    def text(self) -> str:
        return HEARTBEAT_FORMAT.format(step=self.step)


class Failed(NamedTuple):
    """The worker's own report of the exception it dies of, naming the exact step (None: a
    line of this head without one)."""

    step: int | None
    error: str

    def text(self) -> str:
        return f"{FAILED_PREFIX}{self.step}: {self.error}"


class FailedAt(NamedTuple):
    """When (``time.time()``, the host's clock) the worker caught its error."""

    at: float

    def text(self) -> str:
        return f"{FAILED_TIME_PREFIX}{self.at:.6f}"


class Resumed(NamedTuple):
    """A resumed attempt's first step is ``step + 1``; the restore took ``seconds``."""

    step: int
    attempt: int
    seconds: float
    source: str = ""

    def text(self) -> str:
        return RESUMED_FORMAT.format(step=self.step, attempt=self.attempt, seconds=self.seconds) \
            + (f": {self.source}" if self.source else "")


class CacheReport(NamedTuple):
    """The compilation cache's hits and misses; the first call's seconds (None: unknown)."""

    hits: int
    misses: int
    seconds: float | None
    path: str

    def text(self) -> str:
        seconds = "?" if self.seconds is None else f"{self.seconds:.3f}"
        return CACHE_FORMAT.format(hits=self.hits, misses=self.misses, seconds=seconds,
                                   path=self.path)


class CheckpointSaved(NamedTuple):
    """Process 0's checkpoint of ``step`` is complete at ``path``, saved in ``seconds``."""

    step: int
    seconds: float
    path: str

    def text(self) -> str:
        return CHECKPOINT_FORMAT.format(step=self.step, seconds=self.seconds, path=self.path)


class Joining(NamedTuple):
    """About to join the coordinator (``jax.distributed.initialize``)."""

    address: str
    timeout_s: float

    def text(self) -> str:
        return JOINING_FORMAT.format(address=self.address, timeout_s=self.timeout_s)


class Joined(NamedTuple):
    """``jax.distributed.initialize`` returned."""

    process_id: int
    num_processes: int
    address: str

    def text(self) -> str:
        return f"process {self.process_id}/{self.num_processes} joined {self.address}"


class InitFailed(NamedTuple):
    """``jax.distributed.initialize`` raised (the worker exits ``EXIT_INIT``)."""

    error: str

    def text(self) -> str:
        return f"{INIT_FAILED_PREFIX}{self.error}"


class Facts(NamedTuple):
    """Slurm's rendezvous: this node's facts (``worker.contract.nodefacts.facts``), or None
    where the JSON does not read as an object."""

    facts: dict | None

    def text(self) -> str:
        return FACTS_PREFIX + json.dumps(self.facts)


class Done(NamedTuple):
    """The run completed (the worker's last line)."""

    def text(self) -> str:
        return DONE_LINE


class DetailBegin(NamedTuple):
    def text(self) -> str:
        return DETAIL_BEGIN


class DetailEnd(NamedTuple):
    def text(self) -> str:
        return DETAIL_END


class Other(NamedTuple):
    """Any other line: the job's own output, a library's."""

    line: str

    def text(self) -> str:
        return self.line


Line = (Progress | Heartbeat | Failed | FailedAt | Resumed | CacheReport | CheckpointSaved
        | Joining | Joined | InitFailed | Facts | Done | DetailBegin | DetailEnd
        | profiling.Trace | Other)


def parse(line: str) -> Line:
    """The typed line ``line`` is (``Other`` when it is none of the worker's own)."""
    head = line[:1]
    if head == "s":
        return _progress(line) if line.startswith("step ") else Other(line)
    if head == "p":
        if line.startswith("podlaunch-"):
            return _podlaunch(line)
        if line.startswith("process ") and (m := JOINED_RE.match(line)):
            return Joined(int(m["process_id"]), int(m["num_processes"]), m["address"])
        if line.startswith("profile of steps ") and (trace := profiling.parse(line)) is not None:
            return trace
    elif head == "f" and line.startswith(FAILED_PREFIX):
        m = _FAILED_RE.match(line)
        return Failed(int(m["step"]), line[m.end():]) if m else Failed(None, line[len(FAILED_PREFIX):])
    elif head == "r" and (m := RESUMED_RE.match(line)):
        return Resumed(int(m["step"]), int(m["attempt"]), float(m["seconds"] or 0.0),
                       m["source"] or "")
    elif head == "c":
        if m := CACHE_RE.match(line):
            return CacheReport(int(m["hits"]), int(m["misses"]),
                               None if m["seconds"] == "?" else float(m["seconds"]), m["path"])
        if m := CHECKPOINT_RE.match(line):
            return CheckpointSaved(int(m["step"]), float(m["seconds"] or 0.0), m["path"])
    elif head == "j" and (m := JOINING_RE.match(line)):
        return Joining(m["address"], float(m["timeout_s"]))
    elif line == DONE_LINE:
        return Done()
    elif line == DETAIL_BEGIN:
        return DetailBegin()
    elif line == DETAIL_END:
        return DetailEnd()
    return Other(line)


def _progress(line: str) -> Progress | Other:
    match = PROGRESS_RE.match(line)
    if match is None:
        return Other(line)
    try:
        times = [None if match.group(k) is None else float(match.group(k))
                 for k in ("step_time_s", "own_step_time_s")]
        words = match.group("metrics").split()
        metrics = tuple((words[i], float(words[i + 1])) for i in range(0, len(words) - 1, 2))
        return Progress(int(match.group("step")), int(match.group("num_steps")),
                        float(match.group("loss")), float(match.group("steps_per_s")), *times,
                        metrics)
    except ValueError:
        return Other(line)


def _podlaunch(line: str) -> Line:
    if line.startswith(HEARTBEAT_PREFIX):
        m = _HEARTBEAT_RE.match(line)
        return Heartbeat(int(m["step"]) if m else None)
    if m := _FAILED_TIME_RE.match(line):
        return FailedAt(float(m["at"]))
    if line.startswith(INIT_FAILED_PREFIX):
        return InitFailed(line[len(INIT_FAILED_PREFIX):])
    if line.startswith(FACTS_PREFIX):
        try:
            facts = json.loads(line[len(FACTS_PREFIX):])
        except ValueError:
            facts = None
        return Facts(facts if isinstance(facts, dict) else None)
    return Other(line)


# What a worker's error says when a peer died under it (a cascade, not a cause):
# gloo's and the coordination service's words, as JAX 0.9-0.12 print them.
PEER_LOSS_MARKERS = (
    "Gloo all-reduce failed", "Gloo all-gather failed", "Gloo broadcast failed",
    "Connection closed by peer", "Connection reset by peer",
    "coordination service has stopped", "Coordination service", "heartbeat timeout",
    "Terminating process because the JAX distributed service detected fatal errors",
)


def is_peer_loss(line: str) -> bool:
    """Whether a worker's output ``line`` says it failed because a peer went away."""
    return any(marker in line for marker in PEER_LOSS_MARKERS)


def heartbeat_interval_s(stall_timeout_s: float | None) -> float | None:
    """Seconds between a worker's heartbeats: a tenth of the stall timeout, 0.5 to 10 s.

    None (no heartbeats) when the watchdog is off. Each heartbeat waits for the
    current step to finish on the device (one sync per interval, not per step),
    so it proves progress rather than dispatch.
    """
    if not stall_timeout_s:
        return None
    return min(10.0, max(0.5, stall_timeout_s / 10))
