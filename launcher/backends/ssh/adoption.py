"""Taking back a detached ssh or tpu run's workers after its supervisor was killed
(``launch attach``): the hosts connected again (``reconnect``), and on each a follower that
proves the journaled wrapper before anything is signalled and sends its output file from the
journal's offset (``adopt_all``; ``launcher.remote.follow``)."""

from __future__ import annotations

import concurrent.futures
import json

from launcher import plan as planning
from launcher.backends.base import Reattach
from launcher.backends.ssh import fetches, followlines, hostscript
from launcher.backends.ssh import preflight as checks
from launcher.backends.ssh.channels import GroupStates
from launcher.backends.ssh.connection import Host
from launcher.backends.ssh.settings import SshSettings
from launcher.backends.ssh.starting import pid_file
from launcher.backends.ssh.workers import SshWorker
from launcher.errors import LaunchError, Problem, SpecError
from launcher.remote import follow, tail
from worker.contract.address import host_port


def reconnect(ssh, port: int | None, extra_env=None) -> tuple:
    """Connect the run's hosts (``SshHosts`` ``ssh``) for a supervisor that takes the run back:
    host keys checked as any launch's, the preflight with ``preflight.ADOPT`` (the run's own
    processes are neither stale nor stopped; the port they joined at is not checked).

    Returns:
      ``(placements, coordinator address, the preflight's checks)``: the address is host 0's
      with ``port`` (or 0): the processes joined long ago, a restart prepares a new one.
      ``extra_env(coordinator ip)``: per placement, environment beyond the cluster's.
    """
    found = ssh.connect(checks.ADOPT)
    ip = ssh.coordinator_ip()
    return (ssh.placements(extra_env=extra_env(ip) if extra_env else None),
            host_port(ip, port or 0), found)


def adopt_all(plan: planning.Plan, channels: dict, settings: SshSettings, console,
              records: list) -> list:
    """Take back the running workers of ``plan`` that a killed supervisor started detached,
    from their journal ``records`` (``SshWorker.journal_entry`` with ``offset`` and
    ``logged``): on each host a follower proves the wrapper (pid, start ticks, owner) and the
    worker's group before anything is signalled, and sends its output file from the offset;
    each process's log is cut back to the size the journal kept first, so every line is in it
    once. A wrapper no longer alive is classified from its exit report in the file.

    Returns:
      SshWorkers in process_id order.

    Raises:
      SpecError: the records do not name each process once, on its host, with its file;
        nothing was signalled.
      LaunchError: a host's follower could not be started.
    """
    by_id = {r["process_id"]: r for r in records
             if isinstance(r, dict) and isinstance(r.get("process_id"), int)}
    jobs = []
    for index, c in channels.items():
        placement = plan.placements[index]
        for process in plan.on_host(index):
            record = by_id.get(process.process_id)
            out = planning.output_path(placement.run_dir, process.process_id, process.attempt)
            why = _unusable(record, c.host, out)
            if why:
                raise SpecError([Problem("RUN", None, "", (
                    f"process {process.process_id} of the run's attempt {process.attempt} cannot "
                    f"be taken back: {why}; stop what is left and continue the run from its last "
                    "checkpoint (`launch resume RUN --kill-stale`)"))])
            jobs.append((index, c, placement, process, record))
    states = GroupStates(channels)

    def take(job) -> SshWorker:
        index, c, placement, process, record = job
        host = c.host
        _, path = pid_file(host, plan, placement, process.process_id)
        token = str(record["token"])
        argv, files, env = followlines.script(host, plan, placement, process.process_id, (), {
            follow.ARGS_VAR: json.dumps({
                "pid": record["pid"], "since": record["since"], "pgid": record.get("pgid"),
                "offset": record.get("offset") or 0, "out": record["out"],
                "pid_file": path})}, token)
        text = hostscript.shell_script(host.workdir, settings.setup, env, argv, files)
        if isinstance(record.get("logged"), int):  # what follows the offset is read again
            tail.cut(process.log_path, record["logged"])
        on_exit, on_line = fetches.hooks(plan, process, host, placement, console, adopted=True)
        return SshWorker(process, c, states, text, settings.grace_s, token, on_exit, on_line,
                         out_path=record["out"])

    with concurrent.futures.ThreadPoolExecutor(max(1, min(settings.max_parallel, len(jobs)))) as pool:
        futures = [pool.submit(take, job) for job in jobs]
        concurrent.futures.wait(futures)
    errors = [f"{job[1].host.name}: process {job[3].process_id}: {f.exception()}"
              for job, f in zip(jobs, futures) if f.exception() is not None]
    if errors:
        for f in futures:
            if f.exception() is None:
                f.result()._chan.close()  # nothing signalled: its follower just ends
        raise LaunchError("could not take the run's processes back:\n  " + "\n  ".join(errors))
    for c in channels.values():
        c.host.start_keepalive()
    return sorted((f.result() for f in futures), key=lambda w: w.plan.process_id)


def _unusable(record: dict | None, host: Host, out: str) -> str | None:
    """Why a journal record cannot name this process on ``host`` writing to ``out``, or None."""
    if record is None:
        return "the journal does not name it (its supervisor was killed while starting it?)"
    if record.get("host") != host.name:
        return f"the journal has it on {record.get('host')!r}, this attempt's plan on {host.name!r}"
    if record.get("out") != out:
        return f"the journal names another output file ({record.get('out')!r}, not {out!r})"
    if not isinstance(record.get("pid"), int) or not isinstance(record.get("since"), int) \
            or not isinstance(record.get("token"), str) \
            or not isinstance(record.get("offset") or 0, int) \
            or not (record.get("pgid") is None or isinstance(record.get("pgid"), int)):
        return "its journal record is not usable"
    return None


class SshReattach(Reattach):
    """An ssh or tpu run's part in being taken back: each host's wrappers proven and followed
    from the journal's offsets (``adopt_all``) over the session's connected hosts; no
    handle (the hosts are the spec's, or found again from the TPU's name).

    Args:
      hosts: the session's ``SshHosts`` once ``plan`` has connected them (a callable: the TPU
        session makes its hosts at discovery).
      console: the session's.
    """

    def __init__(self, hosts, console):
        self.hosts, self.console = hosts, console

    def adopt(self, plan: planning.Plan, records: list) -> list:
        ssh = self.hosts()
        return adopt_all(plan, ssh.channels, ssh.settings, self.console, records)
