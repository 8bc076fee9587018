"""The lines that end a run: where its files are, and the next commands that work with what
the README installed (``launch tensorboard``, not a ``tensorboard`` the install may lack; a
stopped or failed run's exact ``--resume`` command; after a first success, where to go next).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shlex

from launcher.words import GLOSSARY, pip_install
from worker.contract import redact

CLUSTER_EXAMPLE = "jobs/clusters/ssh-example.yaml"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESUME_PREFIX = "continue this stopped run from its last checkpoint: "


def cluster_example(job_path: str) -> str | None:
    """The ssh cluster example as the user can name it from here: beside the job file
    (``jobs/clusters/ssh-example.yaml`` for ``jobs/linear.yaml``), else the one in podlaunch's
    checkout; relative to the current directory when under it, else absolute; None where
    neither exists (an install without the checkout)."""
    for path in (os.path.join(os.path.dirname(job_path), "clusters", "ssh-example.yaml"),
                 os.path.join(REPO, CLUSTER_EXAMPLE)):
        if os.path.isfile(path):
            relative = os.path.relpath(path)
            return relative if not relative.startswith("..") else os.path.abspath(path)
    return None


def launch_word() -> str:
    """``launch`` as the user can type it here: ``launch`` where that is on PATH and is this very
    install's; else this install's entry point (``.venv/bin/launch`` after the README's first
    command, which runs it by its path), relative to the current directory when under it.
    Next steps are written with it, so that each works as printed."""
    import shutil
    import sys

    candidates = [sys.argv[0]] if os.path.basename(sys.argv[0] or "") == "launch" else []
    candidates.append(os.path.join(os.path.dirname(sys.executable), "launch"))
    mine = next((c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)), None)
    found = shutil.which("launch")
    if mine is None or (found and os.path.realpath(found) == os.path.realpath(mine)):
        return "launch"
    relative = os.path.relpath(mine)
    return shlex.quote(relative if not relative.startswith("..") else os.path.abspath(mine))


def resume_command(job_path: str, run_dir: str, cluster: str | None = None,
                   overrides: tuple = (), secrets=()) -> str:
    """The command that continues the run in ``run_dir``: the same job, cluster and ``--set``s
    (a resume refuses a spec that trains something else), ``--resume RUN_DIR``; a secret's
    value in a ``--set`` (``worker.contract.redact``: its key, the spec's ``secrets``, a
    password in a URL) is shown as ``****``, with a word that it must be given again."""
    argv = ["launch", job_path, *(["--cluster", cluster] if cluster else []),
            *[part for kv in overrides for part in ("--set", kv)], "--resume", run_dir]
    shown = redact.masked_argv(argv, secrets)
    return launch_word() + " " + " ".join(shlex.quote(a) for a in shown[1:]) + (
        "  (secrets shown as ****: give their values again)" if shown != argv else "")


def first_run(runs_root: str, run_dir: str) -> bool:
    """Whether ``runs_root`` (``runs/``, the default's) holds no run but ``run_dir``."""
    others = [os.path.dirname(p) for p in glob.glob(os.path.join(runs_root, "*", "*", "run.json"))]
    return all(os.path.samefile(p, run_dir) for p in others if os.path.exists(p))


def closing(job_path: str, run_dir: str, exit_code: int, tensorboard: bool, *,
            cluster: str | None = None, overrides: tuple = (), default_dir: bool = False,
            secrets=()) -> list:
    """The run's last lines, each a thing to do and how.

    Args:
      job_path: the job file as the user named it.
      run_dir: the run directory.
      exit_code: the launch's exit code (0 succeeded, 130 interrupted, else failed).
      tensorboard: whether the job writes TensorBoard events.
      cluster, overrides: the launch's ``--cluster`` and ``--set``s, repeated in a resume
        (secret values masked: ``resume_command``).
      secrets: the spec's ``secrets:`` names.
      default_dir: the run is in the default place (``runs/JOB/TIME``, no ``--run-dir`` or
        ``--resume``): a success that is the only run under ``runs/`` is the user's first,
        and the lines point to what comes next.

    Returns:
      Lines without a prefix; the console adds its own.
    """
    launch = launch_word()
    lines = [f"logs: {os.path.join(run_dir, 'logs')}"]
    if tensorboard:
        missing = importlib.util.find_spec("tensorboard") is None
        lines.append(f"view: {launch} tensorboard {shlex.quote(run_dir)}"
                     + (f"  (TensorBoard first: {pip_install('tensorboard')})" if missing else ""))
    if exit_code != 0:
        what = "stopped" if exit_code == 130 else "failed"
        lines.append(f"continue this {what} run from its last checkpoint: "
                     + resume_command(job_path, run_dir, cluster, overrides, secrets))
    elif default_dir and first_run(os.path.dirname(os.path.dirname(run_dir)), run_dir):
        job = shlex.quote(job_path)
        example = cluster_example(job_path)
        lines += ["next steps:",
                  f"  {launch} runs                      your runs, newest first",
                  f"  {launch} {job} --set cluster.num_processes=4   the same job on 4 processes",
                  f"  {launch} {job} --cluster {shlex.quote(example) if example else 'CLUSTER.yaml'}"
                  "   on your own SSH hosts (docs/ssh.md; TPU: docs/tpu.md, Slurm: docs/slurm.md)",
                  f"  words such as goodput and attempt: {GLOSSARY}"]
    return lines
