"""What the console and the summary say of the profile traces a run's processes wrote: where
each session's traces are and which process was slowest over its steps.

``launcher.run.profiles`` says a session on the console once its traces are in; the
summary (``launcher.console.status``) says every session of the attempt again at the end.
"""

from __future__ import annotations

import os

from launcher.words import missing, plural
from worker.contract import profiling


def run_dir_of(log_path: str) -> str:
    """The run directory of a process's log (``<run>/logs[/attempt-N]/process-NNN.log``)."""
    folder = os.path.dirname(log_path)
    while os.path.basename(folder) != "logs" and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    return os.path.dirname(folder)


def session_lines(session: str, traces: dict, labels: dict, run_dir: str) -> list:
    """What the console and the summary say of one session: where its traces are, and the
    slowest process over its steps (``traces``: process_id -> Trace)."""
    kept = {p: t for p, t in traces.items() if t.path is not None}
    slowest = max(sorted(traces), key=lambda p: traces[p].ms_per_step)
    fastest = min(sorted(traces), key=lambda p: traces[p].ms_per_step)
    steps = sorted({(t.first, t.last) for t in traces.values()})
    where = os.path.join(run_dir, profiling.PLUGIN_DIR, session)
    said = f"{plural(len(traces), 'process')}; "
    if len(traces) > 1 and traces[slowest].ms_per_step == traces[fastest].ms_per_step:
        said += f"all at {traces[slowest].ms_per_step:.2f} ms per step"
    else:
        said += (f"slowest {labels.get(slowest, f'p{slowest}')} ({traces[slowest].ms_per_step:.2f} "
                 "ms per step" + (f"; fastest {labels.get(fastest, f'p{fastest}')} "
                                  f"{traces[fastest].ms_per_step:.2f}" if len(traces) > 1 else "")
                 + ")")
    install = missing("xprof")  # said before the command that needs it
    out = [f"profile {session}: steps {', '.join(f'{a}-{b}' for a, b in steps)} traced by {said}"]
    if kept:
        out.append(f"profile {session}: {plural(len(kept), 'trace')} in {where}/ "
                   f"({', '.join(os.path.basename(t.path) for t in list(kept.values())[:4])}"
                   f"{', ...' if len(kept) > 4 else ''}); "
                   + (f"the Profile tab needs TensorBoard's profile plugin, first: {install}; then "
                      if install else "")
                   + f"see {'it' if len(kept) == 1 else 'them'} with: launch tensorboard {run_dir} "
                   "(the Profile tab)")
    return out


def by_session(processes: list) -> dict:
    """{session: {process_id: Trace}} of the traces the processes' lines said."""
    sessions: dict = {}
    for t in processes:
        for trace in t.stats.profiles:
            sessions.setdefault(trace.session, {})[t.plan.process_id] = trace
    return sessions


def summary_lines(processes: list) -> list:
    """The summary's lines for every session this attempt's processes traced."""
    if not processes:
        return []
    labels = {t.plan.process_id: t.plan.label for t in processes}
    run_dir = run_dir_of(processes[0].plan.log_path)
    return [line for session, traces in by_session(processes).items()
            for line in session_lines(session, traces, labels, run_dir)]
