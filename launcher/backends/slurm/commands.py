"""Slurm's client commands, run with a scrubbed environment, and their answers parsed.

Every call goes through ``Slurm.run``: the environment loses the
``SLURM_*``/``SBATCH_*``/``SALLOC_*``/``SRUN_*`` variables an outer allocation
leaked into it (they would reshape nested steps), except ``SLURM_CONF`` (which
cluster) and ``SLURM_JOB_ID`` (podlaunch passes ``--jobid`` explicitly anyway).
"""

from __future__ import annotations

import os
import re
import subprocess

from launcher.backends.slurm.gpus import gpu_indices
from launcher.backends.slurm.settings import SRUN_INPUT_PREFIXES
from launcher.errors import LaunchError

KEEP = ("SLURM_CONF", "SLURM_JOB_ID")
PREFIXES = SRUN_INPUT_PREFIXES  # what srun (sbatch, salloc) reads as its own options
# Job states in which no step can run, by what podlaunch does next (docs/slurm.md).
RESUBMIT = ("PREEMPTED", "NODE_FAIL", "BOOT_FAIL")
WAIT = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "CONFIGURING", "RESIZING",
        "SUSPENDED", "STOPPED")


# A node's states (``scontrol show node``'s State=, ``+``-joined) under which it cannot run a job
UNFIT_STATES = {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING"}


def scrubbed(environ=None, extra: dict | None = None, drop=()) -> dict:
    """``environ`` without inherited Slurm variables (but SLURM_CONF, SLURM_JOB_ID) and without
    ``drop``, plus ``extra``.

    The variables srun reads as its options go: inside ``salloc --gpus-per-task=1`` the shell
    has ``SLURM_GPUS_PER_TASK=1`` (and ``SLURM_GPUS_PER_NODE``, ``SLURM_TRES_PER_TASK`` ...),
    which would give each step one GPU of Slurm's choice instead of the plan's."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items()
           if (not k.startswith(PREFIXES) or k in KEEP) and k not in drop}
    env.update(extra or {})
    return env


# What a client command's failure says, and what to do: Slurm 22-24's own words
_ADVICE = (
    (("configuration source", "configuration file", "slurm.conf"),
     "this machine has no Slurm configuration: run launch on a login node of your Slurm cluster "
     "or inside salloc there, or point SLURM_CONF at the cluster's slurm.conf"),
    (("Unable to contact slurm controller", "Connection refused", "Zero Bytes were transmitted"),
     "slurmctld does not answer from here: check scontrol ping, and that this is your cluster's "
     "login node"),
)


def failed(argv: list, output: str) -> str:
    """A client command's failure in one sentence: its fatal (else last) line and, where Slurm's
    words say why, what to do; the doc to read."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    said = next((line for line in lines if ": fatal: " in line), lines[-1] if lines else "no output")
    todo = next((advice for words, advice in _ADVICE if any(w in output for w in words)), None)
    return (f"{' '.join(argv[:3])} failed ({said})" + (f": {todo}" if todo else "")
            + " (docs/slurm.md)")


# A field of ``scontrol -o show``: its key (JobState, StdOut, CPUs/Task, ReqB:S:C:T) and ``=``
FIELD = re.compile(r"[A-Z][A-Za-z0-9_:/]*=")


def parse_record(text: str) -> dict:
    """``scontrol -o show ...`` one-line output as {Key: value}. A value may hold spaces (a
    path's: ``StdOut=/home/me/my runs/...``, ``WorkDir=``, ``Command=``): a word that does not
    start a field goes on the value before it."""
    record: dict = {}
    key = None
    for token in text.strip().split(" "):
        if FIELD.match(token):
            key, _, value = token.partition("=")
            record[key] = value
        elif key is not None:
            record[key] += " " + token
    return record


class Slurm:
    """The client commands (squeue, scontrol, sinfo, sbatch, scancel) of one cluster."""

    def __init__(self, timeout_s: float = 30.0):
        self.timeout_s = timeout_s

    def run(self, argv: list, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        try:
            result = subprocess.run(argv, env=scrubbed(), capture_output=True, text=True,
                                    input=stdin, timeout=self.timeout_s,
                                    stdin=None if stdin is not None else subprocess.DEVNULL)
        except FileNotFoundError:
            raise LaunchError(f"{argv[0]} is not on PATH, so this machine cannot ask Slurm: run "
                              "launch on a login node of your Slurm cluster or inside salloc there, "
                              "or put Slurm's client commands on PATH (docs/slurm.md)") from None
        except subprocess.TimeoutExpired:
            raise LaunchError(f"{' '.join(argv[:3])} did not answer within {self.timeout_s:g} s: "
                              "is slurmctld up? (scontrol ping; docs/slurm.md)") from None
        if check and result.returncode != 0:
            raise LaunchError(failed(argv, result.stderr or result.stdout))
        return result

    def job(self, job_id: str) -> dict | None:
        """``scontrol show job``'s record (JobState, Reason, NodeList, ...), or None once it is gone."""
        result = self.run(["scontrol", "-o", "show", "job", job_id], check=False)
        if result.returncode != 0 or not result.stdout.strip():
            if "Invalid job id" in result.stderr:
                return None
            raise LaunchError(f"scontrol show job {job_id} failed: {result.stderr.strip()}")
        return parse_record(result.stdout.splitlines()[0])

    def gpus(self, job_id: str) -> dict:
        """node -> the job's GPUs there, by Slurm's index (``gpu_indices``); {} when Slurm
        names none (a job without GPUs, a cluster without GresTypes=gpu) or cannot answer."""
        result = self.run(["scontrol", "-o", "-d", "show", "job", job_id], check=False)
        if result.returncode != 0 or not result.stdout.strip():
            return {}
        return gpu_indices(result.stdout.splitlines()[0])

    def hostnames(self, nodelist: str) -> list:
        """A compressed node list (``n[1-3]``) expanded, in Slurm's order."""
        out = self.run(["scontrol", "show", "hostnames", nodelist]).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def node_addrs(self, nodes: list) -> dict:
        """node -> NodeAddr (the address Slurm itself uses to reach it)."""
        out = self.run(["scontrol", "-o", "show", "node", ",".join(nodes)]).stdout
        addrs = {}
        for line in out.splitlines():
            record = parse_record(line)
            if "NodeName" in record:
                addrs[record["NodeName"]] = record.get("NodeAddr") or record["NodeName"]
        return addrs

    def unfit_nodes(self, nodes: list) -> dict:
        """node -> its state and reason, for those of ``nodes`` Slurm holds unfit to run
        (DOWN, DRAIN/DRAINED/DRAINING, FAIL/FAILING, NOT_RESPONDING); never raises."""
        try:
            result = self.run(["scontrol", "-o", "show", "node", ",".join(nodes)], check=False)
        except LaunchError:
            return {}
        unfit = {}
        for line in result.stdout.splitlines():
            record = parse_record(line)
            state = record.get("State", "")
            flags = set(state.upper().replace("*", "+NOT_RESPONDING").split("+"))
            if "NodeName" in record and flags & UNFIT_STATES:
                reason = record.get("Reason")
                unfit[record["NodeName"]] = state + (f" ({reason})" if reason else "")
        return unfit

    def partitions(self) -> dict:
        """partition -> (availability, node count, is_default)."""
        out = self.run(["sinfo", "-h", "-a", "-o", "%P %a %D"]).stdout
        found: dict = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) != 3:
                continue
            name, avail, count = parts
            default = name.endswith("*")
            name = name.rstrip("*")
            _, old_count, old_default = found.get(name, (avail, 0, False))
            found[name] = (avail, old_count + int(count), default or old_default)
        return found

    def jobs_named(self, name: str) -> list:
        """(job id, state) of this user's jobs named ``name`` still in the queue."""
        out = self.run(["squeue", "-h", "--me", "-n", name, "-o", "%i %T"]).stdout
        return [tuple(line.split()[:2]) for line in out.splitlines() if len(line.split()) >= 2]

    def steps_named(self, job_id: str, prefix: str) -> list:
        """(step id ``J.S``, name) of the job's steps whose name starts with ``prefix``."""
        result = self.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"], check=False)
        steps = []
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].startswith(prefix):
                steps.append((parts[0], parts[1]))
        return steps

    def cancel(self, target: str, signal: str | None = None, full: bool = False) -> None:
        """scancel a job or a step ``J.S``; with ``signal`` only signal it; never raises."""
        argv = ["scancel", "-Q"] + ([f"--signal={signal}"] if signal else []) \
            + (["--full"] if full else []) + [target]
        try:
            self.run(argv, check=False)
        except LaunchError:
            pass
