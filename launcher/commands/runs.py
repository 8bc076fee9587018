"""Past runs: each run directory's ``run.json``, and ``launch runs [JOB]``, a table of them.

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
    final_loss   the last loss logged, or null
    duration_s   seconds the launcher ran, over every launch of this run directory (while
                 running: so far, written with the step)
    launcher     {"pid", "host"} of the launch that is running or ran last
    failures     failed attempts by class (launcher.run.classes): {"preemption": 2, ...},
                 over every launch of this run directory
    last_failure {"attempt", "class", "process_id", "why"} of the newest failed attempt,
                 or null
    goodput      productive seconds / wall seconds over every launch (ledger.json,
                 launcher.run.ledger), or null; while running, so far (every 5 s with the
                 step: the attempt under way counted as if it ended then)
    eta_s, progress_at  while running: seconds left as of progress_at (time.time())
    devices      the newest launch's devices: processes x devices each and the platform,
                 "2x2 cpu", "1x4 tpu" (launcher.plan.devices_text)

A run still ``running`` whose launcher is gone (killed with SIGKILL, a
machine that rebooted) is listed as ``unfinished``. Run directories from
before ``run.json`` existed are listed from what they hold (the job from
the directory name, steps and loss from ``tensorboard/metrics.jsonl``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import socket
import time

from launcher import owned
from launcher.run import index
from launcher.errors import Problem, SpecError
from launcher.console.lines import printable as lines_printable
from launcher.words import duration
from launcher.run.record import (  # noqa: F401  (re-exported: run.json's writer)
    RUN_FILE, Record, _count, _failures, _number, _start_ticks, _text, read_record)
from worker.contract import metrics, runfiles

def flat(value, prefix: str = "") -> dict:
    """A nested dict as ``{"dotted.key": leaf}``."""
    if isinstance(value, dict):
        out: dict = {}
        for key, inner in value.items():
            out.update(flat(inner, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def spec_of(run_dir: str) -> dict:
    """The run's resolved spec (``spec.yaml``), flattened to dotted keys; {} if unreadable."""
    import yaml  # the launcher's own dependency; ``launch runs`` alone does not need it

    try:
        return flat(yaml.safe_load(runfiles.read_regular(os.path.join(run_dir, "spec.yaml"))) or {})
    except (OSError, yaml.YAMLError, RecursionError):  # a deeply nested file too
        return {}
STAMP = "%Y%m%d-%H%M%S-%f"  # the default run directory's name, as commands.launch._run_dir makes it






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
    goodput: float | None = None  # productive seconds / wall seconds (launcher.run.ledger)
    eta_s: float | None = None  # a running run's: seconds left as of now
    devices: str = ""  # "2x2 cpu", "1x4 tpu" (launcher.plan.devices_text), "" when unknown


def launcher_alive(launcher) -> bool:
    """Whether the launch that wrote ``launcher`` ({"pid", "host", "since"}) still runs (as far
    as this machine can tell: one on another host is taken to run)."""
    if not isinstance(launcher, dict) or not isinstance(launcher.get("pid"), int):
        return False
    if launcher.get("host") != socket.gethostname():
        return True
    since = _start_ticks(launcher["pid"])
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
                       _number(data.get("final_loss")), _number(data.get("duration_s")), run_dir,
                       _failures(data.get("failures")), _number(data.get("goodput")),
                       eta if state == "running" else None, _text(data.get("devices")))
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


def is_run_dir(path: str) -> bool:
    """Whether ``path`` holds a run (what ``launch`` writes before any worker starts)."""
    return os.path.isfile(os.path.join(path, "spec.yaml")) or os.path.isfile(os.path.join(path, RUN_FILE))


def find(root: str = "runs", job: str | None = None, indexed: bool = False) -> list:
    """Every run under ``root`` (``root/<job>/<run>``), and with ``indexed`` every run the user's
    index knows (``launcher.run.index``: started from any directory), of ``job`` only if given,
    each once, newest first."""
    found = _find_under(root, job)
    if indexed:
        known = index.runs()
        listed = {os.path.realpath(d) for d in known}
        for past in found:  # a lost index gets back what is found where it was looked for
            if os.path.realpath(past.run_dir) not in listed:
                index.add(past.run_dir)
        seen = {os.path.realpath(r.run_dir) for r in found}
        for run_dir in known:
            if os.path.realpath(run_dir) not in seen:
                seen.add(os.path.realpath(run_dir))
                past = read(run_dir)
                if job is None or past.job == job:
                    found.append(past)
    return sorted(found, key=lambda r: (r.started, r.run_dir), reverse=True)


def _find_under(root: str, job: str | None) -> list:
    found = []
    try:
        jobs = [job] if job is not None else sorted(os.listdir(root))
    except OSError:
        return []
    for name in jobs:
        try:
            entries = os.listdir(os.path.join(root, name))
        except OSError:
            continue
        for entry in entries:
            path = os.path.join(root, name, entry)
            if os.path.isdir(path) and is_run_dir(path):
                found.append(read(path))
    return found


def _shown_path(path: str) -> str:
    relative = os.path.relpath(path)
    return lines_printable(path if relative.startswith("..") else relative)


def table(found: list) -> str:
    """The runs as an aligned table, one row each, in the order given."""
    header = ("job", "started", "state", "attempts", "steps", "final loss", "duration", "goodput",
              "failures", "devices", "run dir")
    rows = []
    for r in found:
        steps = "-" if r.step is None else str(r.step) + ("" if r.num_steps is None else f"/{r.num_steps}")
        state = r.state if r.eta_s is None else f"{r.state} (ETA {duration(r.eta_s)})"
        rows.append((r.job, r.started.replace("T", " ") or "-", state,
                     "-" if r.attempts is None else str(r.attempts), steps,
                     "-" if r.final_loss is None else f"{r.final_loss:.6g}",
                     "-" if r.duration_s is None else duration(r.duration_s),
                     "-" if r.goodput is None else f"{r.goodput:.2f}",
                     ", ".join(f"{name} {n}" for name, n in sorted(r.failures.items())) or "-",
                     r.devices or "-", _shown_path(r.run_dir)))
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
    numeric = (3, 4, 7)
    return "\n".join("  ".join(cell.rjust(w) if i in numeric else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
                     for row in [header] + rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch runs",
        description="List past runs (job, started, state, attempts, steps, final loss, duration, "
                    "goodput, failed attempts by class, devices, run dir), newest first.")
    parser.add_argument("job", metavar="JOB", nargs="?", help="only this job's runs (its name)")
    parser.add_argument("--root", default=None,
                        help="only the runs under this folder (default: runs/ here, as launch "
                             "makes them: runs/<job>/<time>, and every run you started anywhere)")
    return parser


def main(argv: list) -> int:
    """Print the table; returns the exit code.

    Raises:
      SpecError: JOB has no runs under the root (exit 2), naming the jobs that do.
    """
    args = _parser().parse_args(argv)
    found = find(args.root or "runs", args.job, indexed=args.root is None)
    if not found:
        root = os.path.abspath(args.root or "runs")
        if args.job is None:
            print(f"launch runs: no runs under {root} yet; `launch JOB.yaml` starts one")
            return 0
        others = sorted(r.job for r in {r.job: r for r in find(args.root or "runs", indexed=args.root is None)}.values())
        raise SpecError([Problem("JOB", None, "", f"no runs of job {args.job!r} under {root}"
                                 + (f"; jobs with runs: {', '.join(others)}" if others else ""))])
    print(table(found))
    if any(r.state == "unfinished" for r in found):
        print("unfinished: its supervisor (the launch) is gone while its state says running "
              "(killed, or its machine went away); workers may still run")
    return 0
