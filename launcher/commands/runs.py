"""``launch runs [JOB]``: the runs of this directory's ``runs/`` and every run the user started
anywhere (``launcher.rundir.index``), a table of each run's ``run.json``
(``launcher.rundir.record``: its keys and how each is read).

A run still ``running`` whose launcher is gone (killed with SIGKILL, a machine that
rebooted) is listed as ``unfinished``; another user's as theirs, not read.
"""

from __future__ import annotations

import argparse
import os

from launcher.errors import Problem, SpecError
from launcher.console.lines import printable as lines_printable
from launcher.rundir.names import find
from launcher.words import duration


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


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch runs",
        description="List past runs (job, started, state, attempts, steps, final loss, duration, "
                    "goodput, failed attempts by class, devices, run dir), newest first.")
    parser.add_argument("job", metavar="JOB", nargs="?", help="only this job's runs (its name)")
    parser.add_argument("--root", metavar="DIR", default=None,
                        help="only the runs under this folder (default: runs/ here, as launch "
                             "makes them: runs/<job>/<time>, and every run you started anywhere)")
    return parser


def main(argv: list) -> int:
    """Print the table; returns the exit code.

    Raises:
      SpecError: JOB has no runs under the root (exit 2), naming the jobs that do.
    """
    args = parser().parse_args(argv)
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
