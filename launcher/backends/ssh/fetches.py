"""What a remote worker's lines bring to this machine: each profile trace it writes, and
process 0's checkpoints (mirrored as they are saved) and results (fetched at its end)."""

from __future__ import annotations

import os
import threading
from typing import Callable

import paramiko

from launcher import plan as planning
from launcher.backends.ssh import transfer
from launcher.backends.ssh.connection import Host
from launcher.backends.ssh.mirror import CheckpointMirror
from launcher.words import plural
from worker.contract import profiling


def fetcher(host: Host, placement: planning.Placement, run_dir: str, console,
             mirror: CheckpointMirror) -> Callable[[], None]:
    def fetch():
        mirror.sync()  # waits for a copy in progress, then takes the last checkpoints
        try:
            count = transfer.fetch_results(host.connection.sftp(), placement.run_dir, run_dir)
        except Exception as exc:  # noqa: BLE001  the run's outcome stands; say what is missing
            console.say(f"could not copy process 0's files from {host.name}: {exc}")
            return
        if count:
            console.say(f"copied {plural(count, 'file')} of process 0 from {host.name} into {run_dir}")
    return fetch


def trace_fetcher(host: Host, process_id: int, remote_run_dir: str, local_run_dir: str,
                   console) -> Callable[[str], None]:
    """A worker's line hook: each trace it says it wrote (``worker.contract.profiling.LINE_FORMAT``) is
    copied from its host into the same place in the local run directory, in the background
    (its own SFTP channel), so ``launch tensorboard`` shows every process's. The line comes
    from the host, so only this process's own trace path (``trace_path``) is copied, once."""
    copied: set = set()

    def on_line(line: str) -> None:
        trace = profiling.parse(line)
        if trace is None or trace.path is None or trace.path in copied:
            return
        if trace.path != os.path.relpath(profiling.trace_path(".", trace.session, process_id), "."):
            console.say(f"{host.name}: not copying {trace.path!r}: not p{process_id}'s trace path")
            return
        copied.add(trace.path)

        def get() -> None:
            local = os.path.join(local_run_dir, trace.path)
            try:
                os.makedirs(os.path.dirname(local), mode=0o700, exist_ok=True)
                sftp = paramiko.SFTPClient.from_transport(host.connection.transport)
                try:
                    sftp.get(f"{remote_run_dir}/{trace.path}", local + ".part")
                finally:
                    sftp.close()
                os.replace(local + ".part", local)
            except Exception as exc:  # noqa: BLE001  the run goes on; say what is missing
                console.say(f"could not copy {trace.path} from {host.name}: {exc}")
        threading.Thread(target=get, name="trace-copy").start()
    return on_line


def hooks(plan: planning.Plan, process: planning.ProcessPlan, host: Host,
           placement: planning.Placement, console, adopted: bool = False) -> tuple:
    """``(on_exit, on_line)`` of a worker: each trace it writes is copied here; process 0's
    checkpoints are mirrored and its results fetched at its end (before a resumed attempt, the
    checkpoints host 0 lacks are put back first, unless ``adopted``: it runs already)."""
    on_exit, on_line = None, trace_fetcher(host, process.process_id, placement.run_dir,
                                            plan.run_dir, console)
    if process.process_id == 0:
        mirror = CheckpointMirror(host, plan.run_dir, placement.run_dir,
                                  plan.job.checkpoint.keep, console)
        if process.resume and not adopted:  # host 0 may be a new machine
            pushed = mirror.push(host.connection.sftp())
            if pushed:
                console.say(f"{host.name}: put back {plural(len(pushed), 'checkpoint')} it lacked "
                            f"(newest {pushed[-1]}) from {mirror.local}")
        on_exit, fetch_traces = fetcher(host, placement, plan.run_dir, console, mirror), on_line

        def on_line(line: str, fetch_traces=fetch_traces, mirror=mirror) -> None:
            mirror.on_line(line)
            fetch_traces(line)
    return on_exit, on_line
