"""Nodes a resubmitted Slurm job is kept off: those that failed under it, and quarantined ones.

A step lost with its job (NODE_FAIL, a node set DOWN) notes the node srun reported failed
and those of the job's nodes Slurm holds unfit at once (``lost``), before Slurm returns a
failed node to service (``ReturnToService``); a node whose processes failed ``restarts.quarantine_after`` times
(infrastructure faults and stalls) is held unfit too (``failed``). When the job is
submitted again (``before_resubmission``), those nodes join ``excluded`` (``sbatch
--exclude``) if Slurm can still place the job without them (``sbatch --test-only``);
else the job goes in with them, and the console says why. Once the new job runs,
``placed`` names the nodes that took their places. After NVIDIA's resiliency extension,
which excludes a failing node from the next launch inside the allocation.
"""

from __future__ import annotations

from launcher.backends.slurm import script
from launcher.words import plural


class NodeExclusions:
    """One run's excluded nodes (see the module's docstring).

    Args:
      slurm: the ``commands.Slurm`` to ask.
      console: where each exclusion is said.
      host_changes: the session's ``host_changes`` list (entries are appended to it).
      quarantine_after: ``restarts.quarantine_after``.
    """

    def __init__(self, slurm, console, host_changes: list, quarantine_after: int):
        self.slurm, self.console, self.host_changes = slurm, console, host_changes
        self.quarantine_after = quarantine_after
        self.excluded: tuple = ()         # nodes every later submission excludes
        self.unfit: dict = {}             # node -> why, to exclude at the next resubmission
        self.failures: dict = {}          # node -> faults of its processes in this run
        self.last_processes: tuple = ()   # the ProcessPlans of the attempt started last
        self._unplaced: list = []         # host_changes entries whose replacement is not known

    def lost(self, nodes: list, failed_node: str | None = None) -> None:
        """A step was lost with its job: note the node srun reported failed, and those of
        ``nodes`` Slurm holds unfit now (a node set DOWN may be back in service by the time
        the job is resubmitted: ``ReturnToService=2`` returns it once its slurmd registers)."""
        if failed_node:
            self.unfit.setdefault(failed_node, "srun reported a node failure on it")
        for node, state in self.slurm.unfit_nodes(nodes).items():
            self.unfit.setdefault(node, f"Slurm holds it {state}")

    def failed(self, plan, failure) -> None:
        """An attempt failed (``launcher.run.classes.Verdict``): count it against its node."""
        if not failure.failure_class.counts_against_host or failure.process_id < 0:
            return
        node = plan.processes[failure.process_id].host
        self.failures[node] = self.failures.get(node, 0) + 1
        if self.failures[node] >= self.quarantine_after:
            self.unfit.setdefault(node, f"quarantined: its processes failed "
                                  f"{plural(self.failures[node], 'time')} in this run "
                                  f"(restarts.quarantine_after "
                                  f"{self.quarantine_after})")

    def before_resubmission(self, job, run_dir: str) -> None:
        """Add the nodes found unfit to ``excluded`` where Slurm can place the job without them."""
        new = {n: why for n, why in self.unfit.items() if n not in self.excluded}
        self.unfit = {}
        if not new:
            return
        # all of them if Slurm can place the job without them; else one by one, in the
        # order found (the node srun reported failed first), as many as still leave room
        taken: dict = {}
        for trial in [list(new)] + ([[n] for n in new] if len(new) > 1 else []):
            if any(n in taken for n in trial):
                continue
            exclude = tuple(self.excluded) + tuple(taken) + tuple(trial)
            said = self._refusal(job, run_dir, exclude)
            if said is None:
                taken.update({n: new[n] for n in trial})
                if len(trial) == len(new):
                    break
            elif len(trial) == 1 or len(new) == 1:
                node = trial[0]
                self.console.say(f"not excluding {node} ({new[node]}): without it Slurm cannot "
                                 f"place the job ({said}); submitting with it")
        self.excluded = tuple(self.excluded) + tuple(taken)
        for node, why in taken.items():
            text = f"{node} excluded from the resubmission (--exclude): {why}"
            self.console.say(text)
            self.host_changes.append({
                "host": node, "by": None, "why": why, "text": text,
                "process_ids": [p.process_id for p in self.last_processes if p.host == node],
                "num_processes": job.num_processes})
            self._unplaced.append(self.host_changes[-1])

    def _refusal(self, job, run_dir: str, exclude: tuple) -> str | None:
        """Why Slurm could not place the job without ``exclude`` (``sbatch --test-only``'s last
        line), or None when it could."""
        result = self.slurm.run(["sbatch", "--test-only"]
                                + script.sbatch_options(job, run_dir, exclude), check=False,
                                stdin=script.script_text(job, run_dir, exclude))
        if result.returncode == 0:
            return None
        said = (result.stderr or result.stdout).strip().splitlines()
        return said[-1] if said else "sbatch --test-only failed"

    def placed(self, before: list, now: list) -> None:
        """The job runs on ``now`` (it ran on ``before``): name each excluded node's replacement."""
        new = [n for n in now if n not in before]
        for change, node in zip(self._unplaced, new):
            change["by"] = node
            change["text"] = change["text"].replace(" excluded from",
                                                    f" replaced by {node}, excluded from")
            self.console.say(f"Slurm placed the resubmitted job on {node} in the place of "
                             f"{change['host']}")
        self._unplaced = []
