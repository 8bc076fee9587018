"""The lines that end a run: where its files are, and the next commands that work with what
the README installed (``launch tensorboard``, not a ``tensorboard`` the install may lack; a
stopped or failed run's ``launch resume RUN``; after a first success, where to go next).

Every command is written to work as printed from any directory (``launch`` where it is on
PATH, else this install's entry point by its absolute path; job and run paths absolute) and
stands on a line of its own, indented under the sentence that says what it does, which the
console never wraps (``launcher.console.width``): a terminal's selection of it pastes whole.
"""

from __future__ import annotations

import glob
import os
import shlex

from launcher.words import GLOSSARY, missing
from worker.contract import redact

CLUSTER_EXAMPLE = "jobs/clusters/ssh-example.yaml"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX_FIRST = "a restart with the same settings repeats this failure: fix its cause (above) first"
COMMAND_INDENT = "  "  # a command's line, under the sentence that says what it does


def cluster_example(job_path: str) -> str | None:
    """The ssh cluster example as the user can name it from any directory (its absolute path):
    beside the job file (``jobs/clusters/ssh-example.yaml`` for ``jobs/linear.yaml``), else the
    one in podlaunch's checkout; None where neither exists (an install without the checkout)."""
    for path in (os.path.join(os.path.dirname(job_path), "clusters", "ssh-example.yaml"),
                 os.path.join(REPO, CLUSTER_EXAMPLE)):
        if os.path.isfile(path):
            return os.path.abspath(path)
    return None


def launch_word() -> str:
    """``launch`` as the user can type it anywhere: ``launch`` where that is on PATH and is this
    very install's; else this install's entry point by its absolute path (``.venv/bin/launch``
    after the README's first command, which runs it by its path). Next steps are written with
    it, so that each works as printed, in this directory or another."""
    import shutil
    import sys

    candidates = [sys.argv[0]] if os.path.basename(sys.argv[0] or "") == "launch" else []
    candidates.append(os.path.join(os.path.dirname(sys.executable), "launch"))
    mine = next((c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)), None)
    found = shutil.which("launch")
    if mine is None or (found and os.path.realpath(found) == os.path.realpath(mine)):
        return "launch"
    return shlex.quote(os.path.abspath(mine))


def resume_command(run_dir: str) -> str:
    """The command that continues the run in ``run_dir`` from any directory: ``launch resume
    RUN_DIR``, which reads the job, cluster and ``--set``s the run recorded
    (``launcher.rundir.launched``: secrets too, so nothing is given again)."""
    return f"{launch_word()} resume {shlex.quote(os.path.abspath(run_dir))}"


def continue_lines(run_dir: str, saved_step: int | None, what: str = "stopped") -> list:
    """What continues a stopped or failed run: a sentence, then its command on a line of its
    own; "from its checkpoint of step N" only where there is one (else the run starts again
    at step 1 in its run directory)."""
    if saved_step is None:
        said = (f"this {what} run saved no checkpoint; run it again from step 1 in its run "
                "directory (add --set KEY=VALUE to change a setting):")
    else:
        said = (f"continue this {what} run from its checkpoint of step {saved_step} (its job "
                "and settings; add --set KEY=VALUE to change one):")
    return [said, COMMAND_INDENT + resume_command(run_dir)]


def _fix_first(job_path: str, run_dir: str, cluster, overrides: tuple, secrets, failure,
               saved_step: int | None, rates: tuple | None = None) -> list:
    """Advice after a failure a restart repeats: what to fix, then the command that runs after
    it (a diverged loss: a new run at a learning rate that does not diverge the same way,
    ``lower_rate``; else ``launch resume`` from the checkpoint there is, or from step 1)."""
    if "optimizer.learning_rate" in failure.why and rates is not None and rates[0] > 0:
        rate, lower, changed = lower_rate(overrides, *rates)
        again = "" if lower.startswith("the job") else "; if that diverges too, a hundredth again"
        return [f"{FIX_FIRST}; the loss diverged: a new run at {lower} ({rate:g} -> "
                f"{rate_of(changed, rates[1]):g}{again}):",
                COMMAND_INDENT + _new_run_command(job_path, cluster, changed, secrets)]
    if saved_step is not None:
        return [f"{FIX_FIRST}, then continue from the checkpoint of step {saved_step} (add "
                "--set KEY=VALUE to change a setting):", COMMAND_INDENT + resume_command(run_dir)]
    return [f"{FIX_FIRST}, then run it again from step 1 in its run directory (it saved no "
            "checkpoint; add --set KEY=VALUE to change a setting):",
            COMMAND_INDENT + resume_command(run_dir)]


LR_KEY = "optimizer.learning_rate="


def lower_rate(overrides: tuple, rate: float, file_rate: float | None) -> tuple:
    """After a diverged loss at learning rate ``rate``: (rate, what the new run is at, its
    overrides). The job file's own rate where a ``--set`` raised the rate above it (a rate
    the job's author chose, and one run away, where lowering by tenths took a run per order
    of magnitude: 1000, 100 and 10 all diverged before 1 did); else a hundredth of the rate
    (a loss that leaves the numbers is rarely a factor of ten from stable)."""
    kept = tuple(kv for kv in overrides if not kv.startswith(LR_KEY))
    if file_rate is not None and 0 < file_rate < rate:
        return rate, "the job file's own learning rate", kept
    return rate, "a hundredth of the learning rate", kept + (f"{LR_KEY}{rate / 100:g}",)


def rate_of(overrides: tuple, file_rate: float | None) -> float:
    """The learning rate ``overrides`` set (their last ``optimizer.learning_rate=``), else the
    job file's."""
    given = [kv[len(LR_KEY):] for kv in overrides if kv.startswith(LR_KEY)]
    return float(given[-1]) if given else file_rate


def _new_run_command(job_path: str, cluster, overrides: tuple, secrets, tail: tuple = ()) -> str:
    """``launch JOB [--cluster C] [--set KV ...] TAIL`` as it works from any directory (the
    files by their absolute paths), secret values masked."""
    argv = ["launch", os.path.abspath(job_path), *(["--cluster", os.path.abspath(cluster)]
                                                   if cluster else []),
            *[part for kv in overrides for part in ("--set", kv)], *tail]
    shown = redact.masked_argv(argv, secrets)
    return launch_word() + " " + " ".join(shlex.quote(a) for a in shown[1:]) + (
        "  (secrets shown as ****: give their values again)" if shown != argv else "")


def first_run(runs_root: str, run_dir: str) -> bool:
    """Whether ``runs_root`` (``runs/``, the default's) holds no run but ``run_dir``."""
    others = [os.path.dirname(p) for p in glob.glob(os.path.join(runs_root, "*", "*", "run.json"))]
    return all(os.path.samefile(p, run_dir) for p in others if os.path.exists(p))


def closing(job_path: str, run_dir: str, exit_code: int, tensorboard: bool, *,
            cluster: str | None = None, overrides: tuple = (), default_dir: bool = False,
            secrets=(), failure=None, saved_step: int | None = None,
            rates: tuple | None = None) -> list:
    """The run's last lines, each a thing to do and how.

    Args:
      job_path: the job file as the user named it.
      run_dir: the run directory.
      exit_code: the launch's exit code (0 succeeded, 130 interrupted, else failed).
      tensorboard: whether the job writes TensorBoard events.
      cluster, overrides: the launch's ``--cluster`` and ``--set``s, repeated in a new run's
        command (secret values masked).
      secrets: the spec's ``secrets:`` names.
      default_dir: the run is in the default place (``runs/JOB/TIME``, no ``--run-dir`` or
        ``--resume``): a success that is the only run under ``runs/`` is the user's first,
        and the lines point to what comes next.
      failure: the last attempt's ``Verdict`` (None: no failure was classified). One a restart
        repeats (``repeats``: a program error) gets a fix to make first and no retry of the
        same: a loss that diverged, a new run at a rate that does not diverge alike; else
        ``launch resume``, "from its checkpoint" only where one exists (``saved_step``: its
        step, or None).
      rates: (the run's learning rate, the job file's own before any ``--set``, or None),
        for a diverged loss's new run (``lower_rate``); None: a job without a learning rate.

    Returns:
      Lines without a prefix; the console adds its own.
    """
    launch = launch_word()
    lines = [f"logs: {os.path.join(run_dir, 'logs')}"]
    if tensorboard:
        install = missing("tensorboard")
        if install:  # said before the command that needs it, and works from any directory
            lines.append(f"TensorBoard is not installed here; first: {install}")
        lines.append(f"view: {launch} tensorboard {shlex.quote(run_dir)}")
    if exit_code not in (0, 130) and getattr(failure, "repeats", False):
        lines += _fix_first(job_path, run_dir, cluster, overrides, secrets, failure, saved_step,
                            rates)
    elif exit_code != 0:
        lines += continue_lines(run_dir, saved_step, "stopped" if exit_code == 130 else "failed")
    elif default_dir and first_run(os.path.dirname(os.path.dirname(run_dir)), run_dir):
        job = shlex.quote(os.path.abspath(job_path))
        example = cluster_example(job_path)
        lines += ["next steps:",
                  f"  {launch} runs                      your runs, newest first",
                  f"  {launch} {job} --set cluster.num_processes=4   the same job on 4 processes",
                  f"  {launch} {job} --cluster {shlex.quote(example) if example else 'CLUSTER.yaml'}"
                  "   on your own SSH hosts (docs/ssh.md; TPU: docs/tpu.md, Slurm: docs/slurm.md)",
                  f"  words such as goodput and attempt: {GLOSSARY}"]
    return lines
