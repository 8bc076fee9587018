"""Stale TPU holders: processes that keep a host's TPU from a new run.

On every host, ``launcher.remote.holders`` finds the processes holding the
TPU device files or libtpu's lock file (by reading ``/proc/*/fd``, never by
name). Holders recorded by an earlier run of this job were already stopped by
the ssh preflight (pid files). Others are stopped (TERM, ``grace_s``, KILL)
only with ``cluster.stop_other_tpu_holders``; a lock file nobody holds is
removed. A dry run stops and removes nothing.
"""

from __future__ import annotations

import concurrent.futures

from launcher import remote
from launcher.backends.ssh import preflight
from launcher.backends.ssh.connection import Host, command_line, run_script
from launcher.backends.tpu.settings import TpuCluster
from launcher.remote import holders as remote_holders
from worker import contract


def _check(host: Host, cluster: TpuCluster, port: int | None, dry_run: bool,
           live_runs: tuple = ()) -> preflight.Check:
    args = {"globs": list(cluster.tpu_device_paths), "lockfile": cluster.libtpu_lockfile,
            "stop_others": cluster.stop_other_tpu_holders, "dry_run": dry_run,
            "grace_s": cluster.grace_s, "port": port, "run_dir_env": contract.RUN_DIR,
            "spare_run_dirs": list(live_runs)}
    argv = remote.python_call(cluster.python, "holders", args)
    try:
        status, output = run_script(host.connection.transport, command_line(argv))
    except Exception as exc:  # noqa: BLE001  every failure becomes a table row
        return preflight.Check(host, f"TPU holder check failed: {exc}")
    facts = remote.parse_marked(output, remote_holders.MARK)
    if facts is None:
        tail = " | ".join(output.strip().splitlines()[-3:]) or "no output"
        return preflight.Check(host, f"TPU holder check failed with exit {status}: {tail}")
    check = preflight.Check(host, None, facts)
    if facts.get("port_error"):
        check.reason = (f"coordinator {facts['port_error']}; stop what holds it or set "
                        "cluster.coordinator_port")
    elif facts["holders"] and dry_run and cluster.stop_other_tpu_holders:
        pass  # a real run would stop them: ``report`` names them
    elif live := sorted({h["podlaunch_run_dir"] for h in facts["holders"]} & set(live_runs)):
        check.reason = (f"TPU in use by another live launch of this job ({', '.join(live)}), its "
                        "launcher still connected: wait for it to end, or stop it (Ctrl-C there)")
    elif facts["holders"]:
        held = "; ".join(f"pid {h['pid']} ({h['cmd']}) holds {', '.join(h['paths'])}"
                         + (" [a podlaunch worker]" if h["podlaunch_run_dir"] else "")
                         for h in facts["holders"])
        check.reason = ("TPU in use: " + held + ("; they survived SIGKILL"
                        if cluster.stop_other_tpu_holders and not dry_run else
                        "; --set cluster.stop_other_tpu_holders=true stops them"))
    return check


def clear(hosts: list, cluster: TpuCluster, port: int | None, dry_run: bool, labels: list,
          live_runs: tuple = ()) -> list:
    """On every host: find processes holding the TPU devices or libtpu's lock file.

    Host 0 also checks that the coordinator ``port`` is free (None: no check). Workers of
    ``live_runs`` (other launches of this job whose launcher is still connected:
    ``preflight.beside``) are never stopped, even with ``stop_other_tpu_holders``.

    Returns:
      One ``preflight.Check`` per host with its facts (holders, stopped pids, lockfile).

    Raises:
      LaunchError: a host still has holders, the port is taken, or the check failed
        (a table of hosts and reasons; every connection closed; nothing was started).
    """
    with concurrent.futures.ThreadPoolExecutor(min(cluster.max_parallel, len(hosts))) as pool:
        checks = list(pool.map(lambda h: _check(h, cluster, port if h.index == 0 else None,
                                                dry_run, tuple(live_runs)), hosts))
    preflight.refuse_unfit(checks, hosts, "TPU check", labels)
    return checks


def report(console, cleared: list, lockfile: str, dry_run: bool) -> None:
    """Say what was stopped or removed on each host (or would be, in a dry run)."""
    for c in cleared:
        facts = c.facts
        if facts["stopped"]:
            console.say(f"{c.host.name}: stopped processes holding the TPU: "
                        + ", ".join(str(p) for p in facts["stopped"]))
        if dry_run and facts["holders"]:
            console.say(f"{c.host.name}: would stop processes holding the TPU (dry run): "
                        + ", ".join(f"{h['pid']} ({h['cmd']})" for h in facts["holders"]))
        if facts["lockfile"] == "removed":
            console.say(f"{c.host.name}: removed stale {lockfile} (no process held it)")
        elif facts["lockfile"] == "stale" and dry_run:
            console.say(f"{c.host.name}: would remove stale {lockfile} (dry run)")
        if facts.get("unreadable"):
            console.say(f"{c.host.name}: could not see the open files of {facts['unreadable']} "
                        "processes of other users; run as root to check them too")
