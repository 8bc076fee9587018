"""Before anything is queued: the request checked against the partition and Slurm's own
``sbatch --test-only``, and the jobs and steps other launches of the job left behind (stale,
or a live launch's that runs beside this one).

Each check raises before a job is submitted or a step started; nothing here keeps state
(the session, ``launcher.backends.slurm.session``, holds it).
"""

from __future__ import annotations

import re

from launcher.backends.slurm import launches, script
from launcher.errors import LaunchError
from launcher.words import plural

TEST_ONLY_NODES = re.compile(r" on nodes (\S+)")


def check_request(slurm, job, run_dir: str, detached: bool, problem) -> list:
    """The partition exists and is up, and Slurm says it could run the request.

    Args:
      slurm: ``launcher.backends.slurm.commands.Slurm``.
      problem: ``(key, message) -> SpecError`` naming ``cluster.<key>`` in the spec.

    Returns:
      The nodes ``sbatch --test-only`` says the job would start on ([] when it does not say).

    Raises:
      SpecError: the partition, the node count or the request's shape cannot be served, or the
        run directory's path cannot be the job's output path (``script.check_run_dir``).
    """
    script.check_run_dir(run_dir)
    cluster = job.cluster
    partitions = slurm.partitions()
    name = cluster.partition or next((p for p, (_, _, d) in partitions.items() if d), None)
    if name is None or name not in partitions:
        known = ", ".join(sorted(partitions)) or "none"
        raise problem("partition", f"unknown partition {name!r} (this cluster has: "
                      f"{known})" if name else f"is unset and Slurm has no default "
                      f"partition; set one of: {known}")
    avail, count, _ = partitions[name]
    if avail != "up":
        raise problem("partition", f"partition {name!r} is {avail}, not up; pick another")
    if cluster.nodes > count:
        raise problem("nodes", f"asks for {cluster.nodes} nodes; partition {name!r} has {count}")
    result = slurm.run(["sbatch", "--test-only"] + script.sbatch_options(job, run_dir),
                       check=False, stdin=script.script_text(job, run_dir, detached=detached))
    said = (result.stderr or result.stdout).strip()
    if result.returncode != 0:
        if "node configuration is not available" in said:  # no node has that shape
            key = ("cpus_per_process" if cluster.cpus_per_process else
                   "devices_per_process" if cluster.platform == "gpu" else "processes_per_node")
            shape = (f"{plural(cluster.processes_per_node, 'process')} per node x "
                     f"{plural(cluster.cpus_per_process or 1, 'CPU')}"
                     + (f" x {plural(cluster.devices_per_process, 'GPU')}"
                        if cluster.platform == "gpu" else ""))
            raise problem(key, f"no node of partition {name!r} fits {shape}; Slurm says: "
                          f"{said.splitlines()[-1]}")
        key = next((k for word, k in (("node count", "nodes"), ("partition", "partition"),
                                      ("time limit", "time_limit"), ("account", "account"),
                                      ("qos", "qos"), ("gres", "devices_per_process"),
                                      ("cpu count", "cpus_per_process"))
                    if word in said.lower()), "sbatch_options")
        raise problem(key, f"Slurm refuses the request: {said.splitlines()[-1]}")
    match = TEST_ONLY_NODES.search(said)
    return slurm.hostnames(match.group(1)) if match else []


def stale_jobs(slurm, name: str, job_name: str, options, console, cancel_and_wait) -> None:
    """Jobs of other launches of this job (Slurm name ``name``) still queued: those whose
    launcher is gone are stale (refused, or cancelled with ``--kill-stale``:
    ``cancel_and_wait(job_id)``); a live launch's job runs beside this one
    (``launches.queued_jobs``).

    Raises:
      LaunchError: stale jobs and no ``--kill-stale`` (or a dry run).
    """
    stale, beside = launches.queued_jobs(slurm, name)
    for job_id, state, run_dir in beside:
        console.say(f"Slurm job {job_id} ({state}) of another launch of {job_name!r} "
                    f"({run_dir}) has its launcher running: this one runs beside it")
    if not stale:
        return
    listed = ", ".join(f"{j} ({s})" for j, s, _ in stale)
    if not options.kill_stale or options.dry_run:
        raise LaunchError(f"Slurm job(s) {listed} named {name} are still queued and "
                          "their launcher is gone; rerun with --kill-stale to cancel them "
                          "(scancel), or wait for them to end by themselves (orphan_timeout_s); "
                          "a detached run's is taken back by `launch attach RUN`")
    console.say(f"cancelling stale Slurm job(s) {listed} (their launcher is gone)")
    for job_id, _, _ in stale:
        cancel_and_wait(job_id)


def stale_steps(slurm, job_id: str, name: str, step_prefix: str, restart: bool, options,
                console, cancel_steps) -> None:
    """Steps of this job in the allocation ``job_id``: this launch's earlier attempt's
    (``step_prefix``; cancelled on a restart) or a gone launcher's (stale); another live
    launch's are left alone.

    Raises:
      LaunchError: stale steps and no ``--kill-stale`` (or a dry run).
    """
    own, stale = launches.job_steps(slurm, job_id, name, step_prefix)
    if own and restart:
        cancel_steps(own)
        own = []
    stale += own
    if not stale:
        return
    listed = ", ".join(f"{s} ({n})" for s, n in stale)
    if not options.kill_stale or options.dry_run:
        raise LaunchError(f"step(s) {listed} of an earlier launch whose launcher is gone still "
                          f"run in allocation {job_id}; rerun with --kill-stale to cancel them")
    console.say(f"cancelling stale step(s) {listed}")
    cancel_steps(stale)
