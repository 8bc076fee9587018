"""Starting the workers on every host: one channel each, the worker under
``launcher.remote.wrapper`` (a process-group leader whose pgid is recorded in a pid file), the
env quoted into a script fed to ``sh -s``; a start that fails anywhere stops every worker
already started, on every host, before ``start_all`` raises.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import socket
import threading

from launcher import plan as planning
from launcher import remote
from launcher.backends.ssh import fetches, followlines, hostscript, syncdir
from launcher.backends.ssh.channels import GroupStates, HostChannels
from launcher.backends.ssh.connection import Host
from launcher.backends.ssh.hosts import expand
from launcher.backends.ssh.preflight import state_dir
from launcher.backends.ssh.settings import SshSettings
from launcher.backends.ssh.workers import SshWorker
from launcher.errors import LaunchError
from launcher.remote import follow, wrapper
from launcher.words import plural


def start_host(plan: planning.Plan, index: int, channels: HostChannels, states: GroupStates,
               settings: SshSettings, console, started: list, job_text: str,
               abort: threading.Event | None = None, syncs: tuple = (),
               detached: bool = False) -> None:
    """Put the job (``job_text``, job.json's) and the directories of ``syncs``
    (``syncdir.walked``'s) on a host and start its workers (placement ``index``);
    ``detached``: each writes its output into a file of the run there, which a follower sends
    (``launcher.remote.follow``), so that they outlive the supervisor and lose nothing.

    Each worker is appended to ``started`` as soon as it runs, so a failure
    anywhere can stop it; ``abort`` set (another host failed) starts no more.
    Process 0's worker also mirrors checkpoints and, at its end, fetches the
    results; before a resumed attempt the checkpoints host 0 lacks are put back first.

    Raises:
      Whatever the host's SFTP or channels raise (paramiko.SSHException, OSError).
    """
    host = channels.host
    placement = plan.placements[index]
    writer = f"{socket.gethostname()}-{os.getpid()}-{index}"
    # The job file goes in the first worker's script (hostscript.file_lines). One session is
    # held back for a stop that finds every other taken: host 0's SFTP session (process 0's
    # results, checkpoints put back), a bare one elsewhere (docs/ssh.md, MaxSessions).
    host.connection.sftp() if index == 0 else channels.reserve()
    syncdir.sync_all(host, syncs, writer, console.say)
    processes = plan.on_host(index)
    for process in processes:
        if abort is not None and abort.is_set():
            return
        # a pid file per run and process; the wrapper as a file, its args in env: a short ps line
        states_dir, pid_path = pid_file(host, plan, placement, process.process_id)
        argv, script = remote.script_call(placement.python, states_dir, "wrapper")
        args = json.dumps({"argv": list(process.argv), "pid_file": pid_path, "process_id":
                           process.process_id, "run_dir": placement.run_dir,
                           "watch_stdin": not detached, "detached": detached,
                           "env_from_stdin": detached})
        token = secrets.token_hex(16)  # the wrapper's control lines carry it; the worker never sees it
        written = f"podlaunch-job-written {token}" if process is processes[0] else None
        files = ((placement.job_path, job_text, writer),) if written else ()
        files += (script + (f"{writer}-p{process.process_id}",),)  # a temporary per process
        env = {**process.env, wrapper.TOKEN_VAR: token, wrapper.ARGS_VAR: args}
        out = None
        if detached:  # the wrapper writes into a file there; a follower sends it (its docstring)
            out = planning.output_path(placement.run_dir, process.process_id, process.attempt)
            argv, files, env = followlines.script(host, plan, placement, process.process_id, files, {
                wrapper.ARGS_VAR: args, follow.ARGS_VAR: json.dumps(
                    {"start": argv, "out": out, "pid_file": pid_path, "env": process.env})}, token)
        text = hostscript.shell_script(host.workdir, settings.setup, env, argv, files,
                                       None if detached else written)  # detached: its follower says
        on_exit, on_line = fetches.hooks(plan, process, host, placement, console)
        started.append(SshWorker(process, channels, states, text, settings.grace_s, token,
                                 on_exit, on_line, written, out))


def pid_file(host: Host, plan: planning.Plan, placement: planning.Placement,
             process_id: int) -> tuple:
    """``(the job's state directory on the host, the process's pid file there)``."""
    states_dir = state_dir(host.workdir, plan.job.name)
    return states_dir, os.path.join(states_dir, f"{os.path.basename(placement.run_dir)}"
                                                f".process-{process_id:03d}.pid")


def stop_started(workers: list) -> None:
    """SIGKILL every worker in ``workers`` (started, unwatched), all at once; returns when done."""
    threads = [threading.Thread(target=w.stop_unwatched, name=f"stop-{w.plan.process_id}")
               for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def start_all(plan: planning.Plan, channels: dict, settings: SshSettings, console,
              detached: bool = False) -> list:
    """Start every worker of ``plan``, hosts in parallel (host i runs placement i).

    Args:
      channels: host index -> ``HostChannels`` of every host, in placement order.
      detached: a detached run's (``start_host``).

    Returns:
      SshWorkers in process_id order.

    Raises:
      LaunchError: some host could not start its workers. The first failure
        stops the hosts still starting, and every worker already started on
        any host is SIGKILLed (and gone) before this raises.
    """
    states = GroupStates(channels)
    started: list = []
    abort = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(min(settings.max_parallel, len(channels)))
    with open(plan.job_path, encoding="utf-8") as f:
        job_text = f.read()  # job.json as each host's first start script writes it
    syncs = [(expand(d), d, settings.sync_rules) for d in [settings.sync_dir] if d]
    # a program runs in the workdir, from its synced directory (program.dir)
    syncs += [(d, d, rules) for _, d, rules in plan.job.synced_dirs]
    syncs = syncdir.walked(syncs, avoid=(plan.run_dir,))
    futures = {pool.submit(start_host, plan, i, c, states, settings, console, started,
                           job_text, abort, syncs, detached): c.host
               for i, c in channels.items()}
    try:
        done, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        if any(f.exception() is not None for f in done):
            abort.set()
        pool.shutdown(wait=True)
    except BaseException:  # an interrupt: hosts finish the worker they are starting, then all stop
        abort.set()
        pool.shutdown(wait=True)
        stop_started(started)
        raise
    errors = [f"{host.name}: {type(f.exception()).__name__}: {f.exception()}"
              for f, host in futures.items() if f.exception() is not None]
    if errors:
        stop_started(started)
        raise LaunchError(f"could not start on every host; stopped the {plural(len(started), 'process')} "
                          "already started:\n  " + "\n  ".join(errors))
    for c in channels.values():
        c.host.start_keepalive()
    return sorted(started, key=lambda w: w.plan.process_id)
