"""``<run dir>/run.json``: a launch's entry (``Record``, its writer) and reading one back
(``read``: what ``launch runs`` lists). Every write replaces the file whole, never through
a link planted in the run directory (``worker.contract.runfiles``).

``launch`` writes ``<run dir>/run.json`` when the workers are about to start
(state ``running``) and again when the run ends, however it ends (Ctrl-C
included); ``--resume`` updates the same file. Its keys::

    job          the job's name
    started      when the run directory's first launch started (local time, ISO 8601)
    state        running, succeeded, diverged (it ran every step, and its final loss is
                 nan or inf: launch exits 1), failed or interrupted
    attempts     attempts made in this run directory (restarts and resumes included; while
                 running, the one under way counted)
    step         the furthest step reached, or null
    num_steps    the steps the job asks for
    final_loss   the last loss logged ("nan", "inf" or "-inf" for one that is not a
                 number: JSON has none), or null
    final_metrics  the job's own metrics at that step ({"accuracy": 0.957}: a task's, a
                 program's scalars besides the loss; worker.contract.wire.Progress), or {}
    duration_s   seconds the launcher ran, over every launch of this run directory (while
                 running: so far, written with the step)
    launcher     {"pid", "host"} of the launch that is running or ran last
    failures     failed attempts by class (launcher.run.classes): {"preemption": 2, ...},
                 over every launch of this run directory
    last_failure {"attempt", "class", "process_id", "why"} of the newest failed attempt,
                 or null
    goodput      productive seconds / wall seconds over every launch (ledger.json,
                 launcher.rundir.ledger), or null; while running, so far (every 5 s with the
                 step: the attempt under way counted as if it ended then)
    eta_s, progress_at  while running: seconds left as of progress_at (time.time())
    devices      the newest launch's devices: processes x devices each and the platform,
                 "2x2 cpu", "1x4 tpu" (launcher.plan.devices_text)
    backend      the newest launch's backend: "local", "ssh", "tpu", "slurm", or a
                 rehearsal's ("tpu-rehearsal", "local-rehearsal"); "" when unknown

A run still ``running`` whose launcher is gone (killed with SIGKILL, a
machine that rebooted) is listed as ``unfinished``. Run directories from
before ``run.json`` existed are listed from what they hold (the job from
the directory name, steps and loss from ``tensorboard/metrics.jsonl``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import time

from launcher import owned, proctl
from launcher.console.lines import printable as lines_printable
from launcher.state import HOST_CHANGE_FIELDS
from launcher.rundir.watcher import RunWatcher
from worker.contract import metrics, runfiles
from worker.contract.wire import SHOWN_METRICS

RUN_FILE = "run.json"
STAMP = "%Y%m%d-%H%M%S-%f"  # the default run directory's name, as run.starts.run_dir_for makes it


def read_record(path: str) -> dict | None:
    """``run.json`` at ``path`` as a dict, or None: unreadable, not a dict, or a symbolic link
    (``worker.contract.runfiles``: a run directory's files are never read through one)."""
    try:
        data = json.loads(runfiles.read_regular(path))
        return data if isinstance(data, dict) else None
    except (OSError, ValueError, RecursionError):  # RecursionError: a deeply nested file
        return None


PROGRESS_EVERY_S = 5.0  # run.json's step, loss and ETA while the run goes on
RESERVED_BYTES = 4096  # run.json's size on disk from the start: its last word needs no new block


def _write(run_dir: str, data: dict) -> None:
    """Replace ``run.json`` whole (a reader never sees half a file); on a full disk, where a
    new file cannot be made, overwrite the old one in place, within the bytes it holds.

    Raises:
      OSError: neither worked (the record is then as it was).
    """
    path = os.path.join(run_dir, RUN_FILE)
    text = json.dumps(data, indent=1) + "\n"
    padded = text + " " * max(RESERVED_BYTES - len(text) - 1, 0) + "\n"  # JSON allows the spaces
    try:  # a temporary of its own, renamed: a link planted in the run directory is replaced
        runfiles.write_whole(path, padded, mode=0o644)
    except OSError:
        if len(padded.encode()) > os.lstat(path).st_size:
            raise
        # the blocks are already the file's: no allocation (never through a link)
        with open(path, "r+b", opener=runfiles.opener) as f:
            f.write(padded.encode())
            f.flush()
            os.fsync(f.fileno())


class Record(RunWatcher):
    """This launch's entry in ``<run dir>/run.json``: ``start`` it, then ``end`` it once.

    Args:
      run_dir: the run directory (it exists).
      job: the job's name.
      num_steps: the steps the job asks for.
      clock: seconds, monotonic (the launch's duration).
      launched_at: when (``clock``) the launch began (default: now).
      running: the ledger's figures while the run goes on (``ledger.Running``), whose goodput
        so far ``progress`` writes; None: run.json keeps the earlier launches' goodput until
        the end.
      devices: this launch's devices (``launcher.plan.devices_text``: ``1x4 tpu``); None:
        the earlier launch's, if any.
      backend: this launch's backend's name (``Backend.name``); None: the earlier launch's.
      notify: ``launcher.run.notify.sender``'s callable, told ``end`` once run.json says how
        the run ended and ``restart`` when an attempt after this launch's first is under way;
        None: nobody is told.
    """

    def __init__(self, run_dir: str, job: str, num_steps: int, clock=time.monotonic,
                 launched_at: float | None = None, running=None, devices: str | None = None,
                 notify=None, backend: str | None = None):
        self.run_dir, self.clock, self.running, self.notify = run_dir, clock, running, notify
        self._first_attempt: int | None = None
        earlier = read_record(os.path.join(run_dir, RUN_FILE)) or {}
        self.data = {
            "job": job,
            "started": earlier.get("started") or datetime.datetime.now().isoformat(timespec="seconds"),
            "state": "running",
            "attempts": earlier.get("attempts") or 0,
            "step": earlier.get("step"),
            "num_steps": num_steps,
            "final_loss": earlier.get("final_loss"),
            "final_metrics": {k: _loss(v) for k, v in _read_own(earlier.get("final_metrics")).items()},
            "duration_s": float(earlier.get("duration_s") or 0.0),
            "failures": _failures(earlier.get("failures")),
            "last_failure": earlier.get("last_failure") if isinstance(earlier.get("last_failure"),
                                                                       dict) else None,
            "goodput": _number(earlier.get("goodput")),
            "host_changes": [c for c in earlier.get("host_changes") or () if isinstance(c, dict)],
            "devices": devices or _text(earlier.get("devices")),
            "backend": backend or _text(earlier.get("backend")),
            "launcher": {"pid": os.getpid(), "host": socket.gethostname(),
                         "since": proctl.start_ticks(os.getpid())},
        }
        self.before_s = self.data["duration_s"]
        self._launched = clock() if launched_at is None else launched_at
        self._progress_at = -float("inf")

    def progress(self, tracked: list, now: float) -> None:
        """While the run goes on (a console watcher): the furthest step, its loss, the ETA
        (``eta_s``, from ``progress_at``, wall time), the goodput so far (over every launch of
        the run, as the ledger will count it at the end, the attempt under way cut at this moment)
        and the duration so far into run.json, every ``PROGRESS_EVERY_S``."""
        if now - self._progress_at < PROGRESS_EVERY_S:
            return
        self._progress_at = now
        from launcher.console.status import eta_s  # the supervising launch has it loaded

        # the attempt under way counts among the attempts made (``launch runs`` said 0 for a
        # run in its first attempt, 1 once it had ended)
        for t in tracked:
            self._under_way(t.worker.plan.attempt)
        reported = [t for t in tracked if t.stats.progress is not None]
        if not reported:
            return
        lead = max(reported, key=lambda t: t.stats.progress.step)
        eta = eta_s(lead, now)
        self.data.update(step=lead.stats.progress.step, final_loss=_loss(lead.stats.progress.loss),
                         final_metrics=_own(lead.stats.progress),
                         eta_s=None if eta is None else round(eta, 1), progress_at=time.time(),
                         duration_s=round(self.before_s + self.clock() - self._launched, 3))
        if self.running is not None:
            goodput = self.running.goodput(tracked, self.clock())  # the ledger's clock
            if goodput is not None:
                self.data["goodput"] = goodput
        try:
            _write(self.run_dir, self.data)
        except OSError:
            pass  # the next one may pass; the end is written regardless

    def run_ended(self, ending) -> None:
        """The run watcher's end (``launcher.rundir.watcher``): run.json says how it ended."""
        self.end(ending.state, ending.result, ending.attempts, made=ending.made,
                 goodput=ending.goodput, ended_at=ending.ended_at)

    def start(self, attempt: int | None = None) -> None:
        """Write run.json as the run starts; ``attempt``: the attempt about to start, counted
        among the attempts made from now (``end`` says how many were made in the end)."""
        if attempt is not None:
            self._under_way(attempt)
        _write(self.run_dir, self.data)

    def _under_way(self, attempt: int) -> None:
        """Count ``attempt`` (0-based), started or about to, among the attempts made; one after
        this launch's first is a restart (``notify``)."""
        before = self.data.get("attempts") or 0
        self.data["attempts"] = max(before, attempt + 1)
        if self._first_attempt is None:
            self._first_attempt = attempt
        elif attempt + 1 > before and self.notify is not None:
            self.notify("restart", dict(self.data))

    def end(self, state: str, result=None, attempts: list = (), made: int | None = None,
            goodput: float | None = None, ended_at: float | None = None) -> None:
        """The run ended: ``state``, and what the last attempt's ``state.Result`` reached.

        Args:
          state: succeeded, diverged (every step ran, the final loss is nan or inf),
            failed or interrupted.
          result: the last attempt's Result, if there is one.
          attempts: every ``restarts.Attempt`` of this launch.
          made: attempts made in the run directory so far, when ``attempts`` is not known
            (the launch ended by an exception).
          goodput: the run's goodput so far (``launcher.rundir.ledger``), when known.
          ended_at: when (``clock``) the duration ends: the moment this launch's ledger entries
            count to (default: now).
        """
        data = self.data
        if state == "succeeded" and result is not None and result.diverged_loss is not None:
            state = "diverged"  # every step ran to a nan loss: no success (launch exits 1)
        data["state"] = state
        data.pop("eta_s", None)
        if made is not None:
            data["attempts"] = made
        elif attempts:
            data["attempts"] = attempts[-1].number + 1
        for attempt in attempts:
            for change in getattr(attempt, "host_changes", ()):
                data.setdefault("host_changes", []).append(
                    {k: change.get(k) for k in ("attempt",) + HOST_CHANGE_FIELDS})
            failure = getattr(attempt, "failure", None)
            if failure is not None:
                name = failure.failure_class.value
                data["failures"][name] = data["failures"].get(name, 0) + 1
                data["last_failure"] = {"attempt": attempt.number, "class": name,
                                        "process_id": failure.process_id,
                                        "why": failure.why[:500]}
        if result is not None:
            reported = [t.stats.progress for t in result.processes if t.stats.progress is not None]
            if reported:
                furthest = max(reported, key=lambda p: p.step)
                data["step"], data["final_loss"] = furthest.step, _loss(furthest.loss)
                data["final_metrics"] = _own(furthest)
            # a run stopped at an agreed step saved it after its last logged one (the summary's
            # table says the same): the step a --resume continues from
            saved = [t.stats.saved_step for t in result.processes if t.stats.saved_step is not None]
            if saved and max(saved) > (data.get("step") or 0):
                data["step"] = max(saved)
        if goodput is not None:
            data["goodput"] = goodput
        ended_at = self.clock() if ended_at is None else ended_at
        data["duration_s"] = round(self.before_s + ended_at - self._launched, 3)
        try:
            _write(self.run_dir, data)
        except OSError:
            pass  # the run's outcome is printed anyway; the table then shows it unfinished
        if self.notify is not None:  # bounded; it never changes the outcome
            self.notify("end", dict(data))


def _failures(value) -> dict:
    """run.json's ``failures`` as read back: class name -> count, anything else dropped."""
    if not isinstance(value, dict):
        return {}
    return {_text(k)[:40]: v for k, v in value.items() if isinstance(k, str) and _count(v)}


def _finite(value: float) -> float | None:
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def _loss(value: float) -> float | str:
    """A loss as run.json keeps it: the number, or its name when it is not one."""
    return value if _finite(value) is not None else str(float(value))


def _own(progress) -> dict:
    """A progress line's own metrics as run.json keeps them: name -> ``_loss``'s value."""
    return {name: _loss(value) for name, value in progress.metrics}


def _read_own(value) -> dict:
    """``final_metrics`` read back: name -> number, at most ``SHOWN_METRICS``; else dropped."""
    read = {_text(k)[:40]: _read_loss(v) for k, v in value.items()
            if isinstance(k, str)} if isinstance(value, dict) else {}
    return dict([(k, v) for k, v in read.items() if k and v is not None][:SHOWN_METRICS])


_NOT_NUMBERS = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _read_loss(value) -> float | None:
    """``_loss``'s value read back (a diverged run's nan or inf kept), else None."""
    return _NOT_NUMBERS[value] if isinstance(value, str) and value in _NOT_NUMBERS else _number(value)


def _text(value) -> str:
    return lines_printable(value)[:200] if isinstance(value, str) else ""


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return _finite(float(value))


@dataclasses.dataclass
class PastRun:
    job: str
    started: str          # ISO 8601, or "" when unknown
    state: str
    attempts: int | None
    step: int | None
    num_steps: int | None
    final_loss: float | None
    duration_s: float | None
    run_dir: str
    failures: dict = dataclasses.field(default_factory=dict)  # class name -> failed attempts
    goodput: float | None = None  # productive seconds / wall seconds (launcher.rundir.ledger)
    eta_s: float | None = None  # a running run's: seconds left as of now
    devices: str = ""  # "2x2 cpu", "1x4 tpu" (launcher.plan.devices_text), "" when unknown
    backend: str = ""  # the newest launch's backend's name ("tpu-rehearsal"), "" when unknown
    metrics: dict = dataclasses.field(default_factory=dict)  # final_metrics: {"accuracy": 0.957}


def launcher_alive(launcher) -> bool:
    """Whether the launch that wrote ``launcher`` ({"pid", "host", "since"}) still runs (as far
    as this machine can tell: one on another host is taken to run)."""
    if not isinstance(launcher, dict) or not isinstance(launcher.get("pid"), int):
        return False
    if launcher.get("host") != socket.gethostname():
        return True
    since = proctl.start_ticks(launcher["pid"])
    return since is not None and since == launcher.get("since")


def _last_metrics(run_dir: str) -> dict:
    """The last record of ``tensorboard/metrics.jsonl``, or {}."""
    path = os.path.join(run_dir, "tensorboard", metrics.METRICS_FILE)
    try:
        with open(path, "rb", opener=runfiles.opener) as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - 65536, 0))
            tail = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return {}
    for line in reversed(tail):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            return record
    return {}


def read(run_dir: str) -> PastRun:
    """What is known of the run in ``run_dir``: its ``run.json``, else what its files say;
    another user's run is listed as theirs, nothing in it read (``owned.check_dir``)."""
    try:
        found = os.lstat(run_dir)
    except OSError:
        found = None
    if found is not None and found.st_uid != os.geteuid():
        return PastRun(os.path.basename(os.path.dirname(run_dir)), "",
                       f"{owned.user_name(found.st_uid)}'s run (not read)", None, None, None,
                       None, None, run_dir)
    data = read_record(os.path.join(run_dir, RUN_FILE))
    if data is not None:
        # any file may be found here (hand-edited, another version's, damaged): each value
        # is taken only if it has its type, so the table never fails on one run
        state = _text(data.get("state")) or "-"
        eta = _number(data.get("eta_s"))
        if state == "running" and not launcher_alive(data.get("launcher")):
            state, eta = "unfinished", None
        elif eta is not None and _number(data.get("progress_at")) is not None:
            eta = max(0.0, eta - max(0.0, time.time() - data["progress_at"]))
        return PastRun(_text(data.get("job")) or os.path.basename(os.path.dirname(run_dir)),
                       _text(data.get("started")), state, _count(data.get("attempts")),
                       _count(data.get("step")), _count(data.get("num_steps")),
                       _read_loss(data.get("final_loss")), _number(data.get("duration_s")), run_dir,
                       _failures(data.get("failures")), _number(data.get("goodput")),
                       eta if state == "running" else None, _text(data.get("devices")),
                       _text(data.get("backend")), _read_own(data.get("final_metrics")))
    try:  # a run directory from before run.json
        started = datetime.datetime.strptime(os.path.basename(run_dir), STAMP).isoformat(timespec="seconds")
    except ValueError:
        try:
            started = datetime.datetime.fromtimestamp(os.path.getmtime(run_dir)).isoformat(
                timespec="seconds")
        except OSError:  # removed while listed
            started = ""
    last = _last_metrics(run_dir)
    return PastRun(os.path.basename(os.path.dirname(run_dir)), started, "-", None,
                   last.get("step"), None, last.get("loss"), None, run_dir)
