"""The batch script podlaunch submits: it holds the allocation; the launcher runs the steps.

Its ``#SBATCH`` lines say what the job needs (nodes, tasks per node, CPUs and
GPUs per task, partition, time limit, account, QoS, requeue, the user's extra
lines). Its body runs nothing of the job: it waits while the launcher renews a
heartbeat file on the shared filesystem, so a launcher killed with SIGKILL
costs at most ``orphan_timeout_s`` of the allocation, and the job ends itself.
The same options go to ``sbatch --test-only`` in the preflight.
"""

from __future__ import annotations

import os
import re
import shlex

from launcher.backends.slurm import launches
from launcher.errors import Problem, SpecError

HEARTBEAT_EVERY_S = 10


def job_name(job) -> str:
    """The Slurm job name (and step name prefix) of every run of ``job``: what --kill-stale finds."""
    return f"podlaunch.{job.name}"


def sbatch_options(job, run_dir: str, exclude: tuple = ()) -> list:
    """The job's options, as ``--key=value`` tokens (for #SBATCH lines and --test-only);
    ``exclude``: nodes the job must not be placed on (a resubmission after a node failed)."""
    c = job.cluster
    opts = [f"--job-name={job_name(job)}", f"--nodes={c.nodes}",
            f"--ntasks-per-node={c.processes_per_node}"]
    if exclude:
        opts.append(f"--exclude={','.join(exclude)}")
    if c.cpus_per_process:
        opts.append(f"--cpus-per-task={c.cpus_per_process}")
    if c.platform == "gpu":
        opts.append(f"--gres=gpu:{c.gpus_per_node}")
    for key, flag in (("partition", "partition"), ("time_limit", "time"), ("account", "account"),
                      ("qos", "qos")):
        if getattr(c, key):
            opts.append(f"--{flag}={getattr(c, key)}")
    if c.signal_lead_s:  # to the tasks (the steps), not the batch shell
        opts.append(f"--signal=TERM@{c.signal_lead_s}")
    opts.append("--requeue" if c.requeue else "--no-requeue")
    opts.append(f"--output={os.path.join(run_dir, 'slurm', 'batch-%j.out')}")
    opts.append("--open-mode=append")
    return opts + list(c.sbatch_options)


def check_run_dir(run_dir: str) -> None:
    """The run directory's path can be the batch job's output path, as it is: it names the run
    to every later launch (``launches.batch_run_dir``) and to ``launch attach``.

    Raises:
      SpecError: it holds a line break or another control character (it would end the
        ``#SBATCH`` line, and the rest of the path would run as a command of the batch script),
        or ``%`` (Slurm reads ``%u``, ``%j`` ... in an output path as its own patterns).
    """
    bad = next((c for c in run_dir if not c.isprintable() or c == "%"), None)
    if bad is not None:
        raise SpecError([Problem("--run-dir", None, "", (
            f"{run_dir!r} holds {'%' if bad == '%' else repr(bad)}, which a Slurm job's output "
            "path cannot carry as it is; name a run directory without it with --run-dir"))])


def directive(opt: str) -> str:
    """``--key=value`` as one ``#SBATCH`` token: a value holding a space, a quote or a backslash
    double-quoted, with ``\\`` and ``"`` escaped (sbatch reads the line as a shell would)."""
    key, sep, value = opt.partition("=")
    if not sep or not re.search(r"[\s'\"\\]", value):
        return opt
    return f'{key}="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def heartbeat_path(run_dir: str) -> str:
    return os.path.join(run_dir, "slurm", "launcher-heartbeat")


def script_text(job, run_dir: str, exclude: tuple = (), detached: bool = False) -> str:
    """The whole batch script (``exclude``: as ``sbatch_options``). ``detached``: a detached
    run's (``launch --detach``), whose steps outlive a killed supervisor: the job ends itself
    only once its launcher is silent for ``orphan_timeout_s`` *and* no step of the run is left
    (``squeue -s``; one that cannot answer counts as a step left), so that the steps train on to
    their end, or the job's time limit, until ``launch attach`` takes the run back."""
    c = job.cluster
    beat = shlex.quote(heartbeat_path(run_dir))
    lines = ["#!/bin/bash"] + [f"#SBATCH {directive(opt)}"
                               for opt in sbatch_options(job, run_dir, exclude)] + [
        f"# Written by podlaunch for job {job.name!r}. It holds the allocation; the launcher",
        "# starts one step per process (srun --ntasks=1 --nodelist=NODE) and cancels this job",
        "# when the run ends. Without the launcher's heartbeat for orphan_timeout_s, it ends itself"
        + (" once no step of the run is left (a detached run's steps train on)." if detached else "."),
        f"beat={beat}",
        f"limit={c.orphan_timeout_s}",
        'echo "podlaunch: job $SLURM_JOB_ID holds $SLURM_JOB_NODELIST (restart count '
        '${SLURM_RESTART_COUNT:-0})"',
    ]
    if detached:  # the run's steps are named <job name>.<run tag>.p<id> (launches.run_tag)
        steps = shlex.quote(f"{job_name(job)}.{launches.run_tag(run_dir)}.")
        lines += [f"steps={steps}", "said="]
    lines += [
        "while :; do",
        '  now=$(date +%s); seen=$(stat -c %Y "$beat" 2>/dev/null || echo 0)',
        '  if [ $((now - seen)) -gt "$limit" ]; then',
    ]
    if detached:
        lines += [
            '    left=$(squeue -h -s -j "$SLURM_JOB_ID" -o %j 2>/dev/null) || left="$steps?"',
            '    case "$left" in',
            '    *"$steps"*)',
            '      [ -n "$said" ] || echo "podlaunch: no launcher heartbeat for $((now - seen)) s;'
            ' the run\'s steps train on (launch attach RUN takes them back)"; said=1;;',
            '    *) echo "podlaunch: no launcher heartbeat for $((now - seen)) s and no step of'
            ' the run left: ending the job"; exit 0;;',
            "    esac",
        ]
    else:
        lines.append('    echo "podlaunch: no launcher heartbeat for $((now - seen)) s: ending the job"; exit 0')
    lines += [
        "  fi" if not detached else '  else said=""; fi  # a launcher beats again: said again if it goes',
        f"  sleep {HEARTBEAT_EVERY_S}",
        "done",
    ]
    return "\n".join(lines) + "\n"
