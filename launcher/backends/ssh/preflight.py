"""Preflight: check every host before anything starts anywhere, and the refusal table.

On every host in parallel (at most ``max_parallel`` at once): connect with
the host key checked, then run ``launcher.remote.preflight`` in the workdir
with the cluster's ``setup`` and ``env``. Then ``judge`` compares the hosts
(python, jax and jaxlib identical everywhere) and reads each one's facts
(modules importable, the coordinator port free on host 0, no survivors of an
earlier run). One unfit host stops the launch: every connection is closed
and the table names every host with its processes and reason.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from typing import Callable, Sequence

from launcher import plan as planning
from launcher import remote
from launcher.backends.ssh import reach, syncdir
from launcher.backends.ssh.connection import Host, run_script
from launcher.backends.ssh.hostscript import shell_script
from launcher.backends.ssh.hosts import connect_error
from launcher.backends.ssh.settings import SshSettings
from launcher.errors import LaunchError
from launcher.remote import preflight as remote_preflight
from launcher.words import plural
from worker import contract

# What preflight does with survivors of an earlier run of the job found on a host: REFUSE
# (the host is unfit), STOP (stop them: --kill-stale), REPORT (leave them: a dry run), OWN
# (stop this run's own, from its failed attempt; refuse another run's: a restart), ADOPT (this
# run's own are the processes a supervisor takes back: left alone; another run's refused).
REFUSE, STOP, REPORT, OWN, ADOPT = "refuse", "stop", "report", "own", "adopt"
SETUP_DONE = "podlaunch-setup-done"  # printed by the preflight script once cluster.setup ran


@dataclasses.dataclass
class Check:
    """What a check found on one host."""

    host: Host
    reason: str | None = None      # why this host is not fit to run, or None
    facts: dict = dataclasses.field(default_factory=dict)


def state_dir(workdir: str, job_name: str) -> str:
    """``<workdir>/.podlaunch/<job>``: the job's job.json and its workers' pid files."""
    return os.path.join(workdir, ".podlaunch", job_name)


def _check_host(host: Host, job, settings: SshSettings, survivors: str, port: int | None,
                run_name: str, reach_argv: list | None = None) -> Check:
    try:
        host.open()
    except Exception as exc:  # noqa: BLE001  every failure becomes a table row
        return Check(host, connect_error(host, exc))
    # the modules its workers import first (none for a program: its imports are its own)
    args = {"modules": list(job.worker_modules), "port": port if host.index == 0 else None,
            "commands": list(job.host_commands),
            "kill_stale": survivors == STOP, "stop_own": survivors == OWN,
            "keep_own": survivors == ADOPT,
            "grace_s": settings.grace_s,
            "state_dir": state_dir(".", job.name), "run_dir_env": contract.RUN_DIR,
            "own_run_dir": os.path.join("runs", job.name, run_name),  # relative to the workdir
            # what a start's sync needs to see that it would change nothing (no SFTP then)
            "synced": syncdir.MANIFEST if settings.sync_dir or job.synced_dirs else None}
    program = remote.python_call(settings.python, "preflight", args)
    # with reach_argv: the coordinator reach check from this host, after the preflight, in
    # its channel (reach.Listener)
    argv, first = (reach_argv, (program,)) if reach_argv else (program, ())
    text = shell_script(host.workdir, settings.setup, dict(settings.env), argv, first=first,
                        setup_mark=SETUP_DONE if settings.setup else None)
    try:
        status, output = run_script(host.connection.transport, text)
    except Exception as exc:  # noqa: BLE001
        return Check(host, f"preflight command failed: {exc}")
    facts = remote.parse_marked(output, remote_preflight.MARK)
    if facts is not None:
        if reach_argv:
            facts["reach"] = reach.answer(output)
        return Check(host, None, facts)
    return Check(host, failed_text(status, output, settings))


def failed_text(status: int, output: str, settings: SshSettings) -> str:
    """Why the preflight script of a host ended with ``status`` before its facts, read from
    how far it got: the setup's lines did not all run (no ``SETUP_DONE`` line), or the
    interpreter after them. Exit 127 is the shell's "command not found" (POSIX, 2.8.2), of a
    setup line's command (a ``conda activate`` or ``module load`` missing on this host) or of
    ``cluster.python``; 126 found but not executable."""
    lines = output.strip().splitlines()
    setup_ran = not settings.setup or SETUP_DONE in lines
    shown = [line for line in lines if line != SETUP_DONE]
    tail = " | ".join(shown[-3:]) or "no output"
    if not setup_ran:
        what = {127: "a command of cluster.setup was not found on this host (exit 127)",
                126: "a command of cluster.setup is not executable on this host (exit 126)"}.get(
            status, f"the workdir or cluster.setup failed with exit {status}")
        return (f"{what}: {tail}; run the setup lines by hand there (ssh, then each line), and "
                "install what is missing or fix the line")
    if status == 127:
        return (f"{settings.python} not found ({tail}); set cluster.python to the remote "
                "interpreter's absolute path" + (" (or activate it in cluster.setup)"
                                                 if settings.setup else ""))
    if status == 126:
        return f"{settings.python} is not executable ({tail}); set cluster.python to an interpreter"
    return f"workdir/python failed with exit {status}: {tail}"


VERSION_KEYS = ("python", "jax", "jaxlib")


def judge(checks: list, job, python: str, survivors: str, reference: dict | None = None) -> None:
    """Fill in ``reason`` for hosts that answered but are unfit.

    Args:
      reference: the versions every host must have (``VERSION_KEYS``: the run's hosts', for
        a spare or a restart); None: the first host that answered sets them.
    """
    answered = [c for c in checks if c.reason is None]
    if answered:
        keys = VERSION_KEYS
        if reference is None:
            want, whose = {k: answered[0].facts.get(k) for k in keys}, f"host {answered[0].host.name}"
        else:
            want, whose = reference, "the run's hosts"
        for c in answered:
            if c.facts.get("jax") is None or c.facts.get("jaxlib") is None:
                c.reason = "jax/jaxlib not installed for " + python
                continue
            diff = [f"{k} {c.facts.get(k)} ({whose}: {want[k]})"
                    for k in keys if c.facts.get(k) != want[k]]
            if diff:
                c.reason = "version mismatch: " + ", ".join(diff)
    for c in answered:
        if c.reason:
            continue
        # a survivor whose launcher is still connected is a launch beside this one, not stale
        live = [r for r in c.facts.get("survivors", ()) if r["pids"] and not r.get("live_launch")
                and not r.get("own")]
        if c.facts.get("foreign_worker"):
            c.reason = (f"{c.facts['foreign_worker']} is a module named worker found before "
                        "podlaunch's (on cluster.env.PYTHONPATH or in the workdir): every "
                        "process would run it instead; rename it, or take its directory off "
                        "cluster.env.PYTHONPATH")
        elif c.facts.get("missing_commands"):
            c.reason = (f"program.argv[0] {c.facts['missing_commands'][0]!r} is not on this "
                        f"host's PATH (after cluster.setup and cluster.env; workdir "
                        f"{c.facts.get('workdir')}): install it there, give its absolute "
                        "path, or put its directory on cluster.env.PATH")
        elif c.facts.get("missing_modules"):
            c.reason = (f"not importable: {', '.join(c.facts['missing_modules'])}; install podlaunch "
                        "there, set cluster.env.PYTHONPATH, or use cluster.sync_dir")
        elif c.facts.get("port_error"):
            c.reason = f"coordinator {c.facts['port_error']}; pick another cluster.coordinator_port or 0"
        elif live and survivors != REPORT:
            ids = ", ".join(f"p{r['process_id']} (pgid {r['pgid']})" for r in live)
            c.reason = (f"{plural(len(live), 'process group')} of an earlier run of {job.name!r} still alive: "
                        f"{ids} from {live[0]['run_dir']}; "
                        + ("they survived SIGKILL" if all(r.get("stopped") for r in live)
                           else "their launcher is gone: rerun with --kill-stale to stop them"))


def labels(job, placements: Sequence[planning.Placement]) -> list:
    """Per placement, its processes as ``make_plan`` numbers them ("p0", "p2,p3").

    The refusal table comes before any plan exists; the ids are ``make_plan``'s
    (``planning.process_ids``: a whole plan per host cost 3-6 ms of the launcher's CPU each).
    """
    return [",".join(f"p{i}" for i in ids) for ids in planning.process_ids(placements)]


def table(checks: list, host_labels: Sequence[str]) -> str:
    """Hosts and reasons, one row each, in host order."""
    width = max(len(c.host.name) for c in checks)
    rows = [f"  {'host':<{width}}  processes  reason"]
    for c, ids in zip(checks, host_labels):
        rows.append(f"  {c.host.name:<{width}}  {ids:<9}  {c.reason or 'ok'}")
    return "\n".join(rows)


def refuse_unfit(checks: list, hosts: list, what: str, host_labels: Sequence[str],
                 outcome: str = "nothing was started anywhere") -> None:
    """Close every connection and raise if any check has a reason.

    Raises:
      LaunchError: "<what> failed on k of n hosts; <outcome>." and the table.
    """
    bad = [c for c in checks if c.reason]
    if bad:
        for h in hosts:
            h.close()
        raise LaunchError(f"{what} failed on {len(bad)} of {plural(len(hosts), 'host')}; "
                          f"{outcome}.\n{table(checks, host_labels)}")


def preflight(hosts: list, job, settings: SshSettings, host_labels: Sequence[str],
              survivors: str = REFUSE, port: int | None = None, run_name: str = "",
              refuse: bool = True, reference: dict | None = None,
              listen: Callable[[Check], reach.Listener | None] | None = None) -> list:
    """Check every host in parallel (at most ``max_parallel`` at once); connections stay open.

    Args:
      hosts: resolved, unopened hosts in placement order.
      job: the validated spec (name, task).
      settings: the cluster's SSH settings (python, setup, env, grace_s, max_parallel).
      host_labels: per host, its processes ("p0"), for the refusal table.
      survivors: REFUSE (a survivor makes its host unfit), STOP (stop them: TERM,
        ``grace_s``, KILL), REPORT (leave them, the host stays fit: a dry run) or OWN (stop
        this run's own, refuse another run's: a restart, whose hosts may be new spares).
      port: the coordinator port to check on host 0 (0 picks a free one); None: no check.
      run_name: this run's directory name on its hosts (``plan.remote_run_name``: its earlier
        attempts' survivors are its own).
      refuse: raise when a host is unfit; False: return its Check with the reason, its
        connection closed (a restart that can put a spare in its place).
      reference: the versions every host must have (``judge``); None: the first host's.
      listen: with two hosts or more, host 0 is checked first and ``listen(its Check)``
        may start host 0's coordinator listener (``reach.Listener``): each other host's
        preflight then tries it too, its answer in ``facts["reach"]``.

    Returns:
      One Check per host, in host order, with facts (``workdir`` absolute,
      ``port`` on host 0, versions, ``survivors``). Each host's ``workdir`` is
      now absolute.

    Raises:
      LaunchError: any host is unfit; the message is a table of hosts and
        reasons, and every connection has been closed (nothing was started).
    """
    def check(host: Host, listener: reach.Listener | None = None) -> Check:
        return _check_host(host, job, settings, survivors, port, run_name,
                           listener.connect_argv(host.python) if listener else None)

    with concurrent.futures.ThreadPoolExecutor(min(settings.max_parallel, len(hosts))) as pool:
        if listen is None or len(hosts) < 2:
            checks = list(pool.map(check, hosts))
        else:  # host 0 first: its port, then its listener, which the others' checks try
            first = check(hosts[0])
            listener = listen(first)
            checks = [first, *pool.map(lambda h: check(h, listener), hosts[1:])]
    judge(checks, job, settings.python, survivors, reference)
    if refuse:
        refuse_unfit(checks, hosts, "preflight", host_labels)
    for c in checks:
        if c.reason is None:
            c.host.workdir = c.facts["workdir"]
            c.host.synced = c.facts.get("synced")
        else:
            c.host.close()
    return checks


def beside(checks: list) -> list:
    """The run directories of other launches of the job still connected to their launcher."""
    return sorted({r["run_dir"] for c in checks for r in c.facts.get("survivors", ())
                   if r.get("live_launch") and r["pids"]})


def survivors_found(checks: list, stopped: bool = True) -> list:
    """Survivor records preflight stopped (or, ``stopped=False``, left alive), once each
    (hosts may share a filesystem)."""
    seen = {}
    for c in checks:
        for r in c.facts.get("survivors", ()):
            if r.get("live_launch") or r.get("own"):
                continue
            if bool(r.get("stopped")) == stopped and (stopped or r["pids"]):
                seen.setdefault((r["pgid"], r["run_dir"]), r)
    return list(seen.values())
