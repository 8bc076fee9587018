"""``launch runs [JOB] [-n N] [--state STATE]``: the runs of this directory's ``runs/`` and
every run the user started anywhere (``launcher.rundir.index``), a table of each run's
``run.json`` (``launcher.rundir.record``: its keys and how each is read), newest first.

The table fits the terminal (80 columns at least, wider where the terminal is; piped: 80
or ``COLUMNS``): a row is never wrapped. Each run is named as every run command takes it
(``JOB/STAMP``, the last two parts of its directory); the columns a narrow terminal has no
room for are left out, the least needed first (``OPTIONAL``). A run still ``running`` whose
launcher is gone (killed with SIGKILL, a machine that rebooted) is listed as ``unfinished``;
another user's as theirs, not read.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import textwrap

from launcher.errors import Problem, SpecError
from launcher.console.lines import printable as lines_printable
from launcher.rundir.names import find, short
from launcher.words import duration, plural

MIN_COLUMNS = 80  # the table fits this many whatever the terminal says
LIMIT = 20  # rows shown by default: the header stays on a 24-line screen
STATES = ("running", "succeeded", "failed", "interrupted", "diverged", "unfinished")
ENDED = ("succeeded", "failed", "interrupted", "diverged")
# the columns beside run, state, steps and loss, in the order they are given up for room
OPTIONAL = ("run dir", "devices", "failures", "attempts", "goodput", "time")
JOB_KEPT = 8  # characters of a job's name kept in a run's name before ``time`` is given up


def _shown_path(path: str) -> str:
    relative = os.path.relpath(path)
    return lines_printable(path if relative.startswith("..") else relative)




def steps_cell(r) -> str:
    """``reached/planned``: the furthest step the run reached (logged, or saved by an agreed
    stop), of the steps its job asks for."""
    if r.step is None:
        return "-"
    return str(r.step) + ("" if r.num_steps is None else f"/{r.num_steps}")


def _cells(r, own: tuple = ()) -> dict:
    loss = "-" if r.final_loss is None else f"{r.final_loss:.4g}"
    state = r.state if r.eta_s is None else f"{r.state}, ETA {duration(r.eta_s)}"
    return {"run": lines_printable(short(r.run_dir)), "state": state, "steps": steps_cell(r),
            "loss": loss,
            **{name: "-" if r.metrics.get(name) is None else f"{r.metrics[name]:.4g}" for name in own},
            "time": "-" if r.duration_s is None else duration(r.duration_s),
            "goodput": "-" if r.goodput is None else f"{r.goodput:.2f}",
            "attempts": "-" if r.attempts is None else str(r.attempts),
            "failures": ", ".join(f"{name} {n}" for name, n in sorted(r.failures.items())) or "-",
            "devices": r.devices or "-", "run dir": _shown_path(r.run_dir)}


HEADERS = ("run", "state", "steps", "loss", "time", "goodput", "attempts", "failures", "devices",
           "run dir")
NUMERIC = ("steps", "loss", "time", "goodput", "attempts")
OWN_COLUMNS = 2  # columns of the jobs' own final metrics (accuracy) after the loss, at most


def table(found: list, width: int = MIN_COLUMNS) -> str:
    """The runs as an aligned table, one row each, in the order given, no row wider than
    ``width`` columns: the columns of ``OPTIONAL`` are left out, the first first, until the
    rows fit; before ``time``, long job names are cut (``diabetes…/STAMP``: the stamp alone
    names the run too); a run name that still does not fit is cut at its start (``…``).

    ``loss`` is an ended run's final loss and a running run's latest (the state says which),
    and after it the jobs' own metrics at that step (a task's ``accuracy``: run.json's
    ``final_metrics``), where a run listed has any, given up for room last;
    ``steps``: see ``steps_cell``; ``time``: seconds the launcher ran, every launch of the
    run directory together."""
    own = tuple(dict.fromkeys(name for r in found for name in r.metrics
                              if name not in HEADERS))[:OWN_COLUMNS]
    rows = [_cells(r, own) for r in found]
    at = HEADERS.index("loss") + 1
    headers = HEADERS[:at] + own + HEADERS[at:]
    columns = list(headers)

    def widths(cols):
        return {c: max([len(c)] + [len(row[c]) for row in rows]) for c in cols}

    def total(cols):
        return sum(widths(cols).values()) + 2 * (len(cols) - 1)

    def shorten(keep: int) -> None:  # the job's part of each name to ``keep`` characters
        for row in rows:
            job, _, stamp = row["run"].rpartition("/")
            if len(job) > keep:
                row["run"] = job[:max(keep - 1, 1)] + "…/" + stamp

    for dropped in OPTIONAL + own[::-1]:
        if total(columns) <= width:
            break
        if dropped == "time":  # the jobs' long names give room first
            over = total(columns) - width
            longest = max(len(row["run"].rpartition("/")[0]) for row in rows)
            shorten(max(longest - over, JOB_KEPT))
            if total(columns) <= width:
                break
        columns.remove(dropped)
    over = total(columns) - width
    if over > 0:  # the run's name: its end (the stamp) is what tells runs apart
        keep = max(widths(columns)["run"] - over, 8)
        for row in rows:
            if len(row["run"]) > keep:
                row["run"] = "…" + row["run"][-(keep - 1):]
    sized = widths(columns)
    lines = []
    for row in [dict(zip(headers, headers))] + rows:
        lines.append("  ".join(row[c].rjust(sized[c]) if c in NUMERIC + own else row[c].ljust(sized[c])
                               for c in columns).rstrip())
    return "\n".join(lines)


def width() -> int:
    """The table's width: the terminal's (``COLUMNS`` first), never under ``MIN_COLUMNS``."""
    return max(MIN_COLUMNS, shutil.get_terminal_size((MIN_COLUMNS, 24)).columns)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch runs",
        description="List runs, newest first: each as run commands name it (JOB/STAMP), its "
                    "state, steps, loss and the job's own metrics (accuracy), time, goodput, "
                    "attempts, failed attempts by class, devices and run dir, as many columns as "
                    "the terminal has room for.")
    parser.add_argument("job", metavar="JOB", nargs="?", help="only this job's runs (its name)")
    parser.add_argument("-n", "--limit", type=int, default=LIMIT, metavar="N",
                        help=f"the newest N runs (default {LIMIT}; 0: every run)")
    parser.add_argument("--state", metavar="STATE", action="append", default=[],
                        help="only runs in this state (" + ", ".join(STATES) + "; repeatable, "
                             "or comma-separated)")
    parser.add_argument("--root", metavar="DIR", default=None,
                        help="only the runs under this folder (default: runs/ here, as launch "
                             "makes them: runs/<job>/<time>, and every run you started anywhere)")
    return parser


def _states(given: list) -> set:
    """The states ``--state`` asked for.

    Raises:
      SpecError: one that is no run's state, with the closest and every state.
    """
    wanted = {s.strip() for value in given for s in value.split(",") if s.strip()}
    problems = []
    for state in sorted(wanted - set(STATES)):
        close = difflib.get_close_matches(state, STATES, n=1, cutoff=0.5)
        problems.append(Problem("--state", None, "", f"{state!r} is no run's state"
                                + (f"; did you mean {close[0]!r}?" if close else "")
                                + f" (states: {', '.join(STATES)})"))
    if problems:
        raise SpecError(problems)
    return wanted


def main(argv: list) -> int:
    """Print the table; returns the exit code.

    Raises:
      SpecError: JOB has no runs under the root (exit 2), naming the jobs that do; a
        ``--state`` or ``--limit`` that is not one.
    """
    args = parser().parse_args(argv)
    states = _states(args.state)
    if args.limit < 0:
        raise SpecError([Problem("--limit", None, "", f"expected a number of runs >= 0 (0: "
                                 f"every run), got {args.limit}")])
    found = find(args.root or "runs", args.job, indexed=args.root is None)
    where = (os.path.abspath(args.root) if args.root else
             f"{os.path.abspath('runs')} and your index of runs started anywhere")
    if not found:
        if args.job is None:
            print(f"launch runs: no runs under {where} yet; `launch JOB.yaml` starts one")
            return 0
        others = sorted(r.job for r in {r.job: r for r in find(args.root or "runs", indexed=args.root is None)}.values())
        raise SpecError([Problem("JOB", None, "", f"no runs of job {args.job!r} under {where}"
                                 + (f"; jobs with runs: {', '.join(others)}" if others else ""))])
    chosen = [r for r in found if not states or r.state in states]
    if not chosen:
        print(f"launch runs: none of the {plural(len(found), 'run')} is "
              f"{' or '.join(sorted(states))} (under {where})")
        return 0
    shown = chosen if args.limit == 0 else chosen[:args.limit]
    print(table(shown, width()))
    if len(shown) < len(chosen):
        print(f"({len(shown)} of {plural(len(chosen), 'run')} shown, newest first; "
              f"-n 0 shows all)")
    if any(r.state == "unfinished" for r in shown):
        print(textwrap.fill("unfinished: its supervisor (the launch) is gone while its state "
                            "says running (killed, or its machine went away); workers may "
                            "still run", width()))
    return 0
