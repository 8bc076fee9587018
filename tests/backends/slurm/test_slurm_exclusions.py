"""Which failed nodes a Slurm resubmission excludes (launcher.backends.slurm.exclusions),
process-free: ``sbatch --test-only`` answered by a fake that can place the job without
some nodes and not without others, as a partition of that many nodes would."""

from __future__ import annotations

import subprocess

from launcher.backends.slurm.exclusions import NodeExclusions
from launcher.console import NullConsole


class Said(NullConsole):
    def __init__(self):
        super().__init__()
        self.lines = []

    def say(self, text: str) -> None:
        self.lines.append(text)


class Partition:
    """``sbatch --test-only``: the job needs ``nodes`` of ``names``, less those excluded."""

    def __init__(self, names, nodes: int):
        self.names, self.nodes, self.asked = list(names), nodes, []

    def run(self, argv, check=True, stdin=None):
        exclude = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--exclude=")), [])
        self.asked.append(exclude)
        ok = len([n for n in self.names if n not in exclude]) >= self.nodes
        return subprocess.CompletedProcess(argv, 0 if ok else 1, "", "" if ok else (
            "sbatch: error: Batch job submission failed: Requested node configuration is not "
            "available"))

    def unfit_nodes(self, nodes):
        return {}


class Job:
    def __init__(self, nodes: int):
        self.num_processes = nodes
        self.cluster = type("C", (), {"nodes": nodes, "processes_per_node": 1, "cpus_per_process": None,
                                      "platform": "cpu", "partition": None, "time_limit": None,
                                      "account": None, "qos": None, "requeue": False,
                                      "sbatch_options": (), "time_limit_lead_s": 0, "signal_lead_s": 0,
                                      "orphan_timeout_s": 600})()
        self.name = "linear"


def exclusions(partition, *failed) -> tuple[NodeExclusions, Said]:
    said = Said()
    found = NodeExclusions(partition, said, [], quarantine_after=2)
    found.last_processes = tuple(type("P", (), {"process_id": i, "host": f"n{i + 1}"})()
                                 for i in range(3))
    for node in failed:
        found.lost([], node)
    return found, said


def test_every_failed_node_is_excluded_when_the_partition_has_room():
    found, said = exclusions(Partition(["n1", "n2", "n3", "n4", "n5"], 3), "n2", "n3")
    found.before_resubmission(Job(3), "/tmp/run")
    assert found.excluded == ("n2", "n3")
    assert [c["host"] for c in found.host_changes] == ["n2", "n3"]
    assert said.lines[0] == ("n2 excluded from the resubmission (--exclude): srun reported a "
                             "node failure on it")


def test_as_many_as_leave_room_are_excluded_the_first_found_first():
    # 4 nodes for 3 tasks: without n2 and n3 the job cannot be placed, without n2 it can
    found, said = exclusions(Partition(["n1", "n2", "n3", "n4"], 3), "n2", "n3")
    found.before_resubmission(Job(3), "/tmp/run")
    assert found.excluded == ("n2",)
    assert any(line.startswith("not excluding n3 (srun reported a node failure on it): without "
                               "it Slurm cannot place the job (sbatch: error:") for line in said.lines)
    # a later resubmission keeps n2 excluded, and tries the new one on top of it
    found.lost([], "n4")
    found.before_resubmission(Job(3), "/tmp/run")
    assert found.excluded == ("n2",)


def test_no_node_is_excluded_when_the_job_needs_every_node():
    found, said = exclusions(Partition(["n1", "n2", "n3"], 3), "n2")
    found.before_resubmission(Job(3), "/tmp/run")
    assert found.excluded == () and not found.host_changes
    assert said.lines == ["not excluding n2 (srun reported a node failure on it): without it Slurm "
                          "cannot place the job (sbatch: error: Batch job submission failed: "
                          "Requested node configuration is not available); submitting with it"]


def test_the_lead_is_asked_for_a_finite_time_limit_only():
    """``SlurmCluster.signal_lead_s``: what the batch script asks (``--signal=TERM@N``) and
    what the judge reads a SIGTERM end against, one value."""
    from launcher.backends.slurm import script
    from launcher.backends.slurm.settings import SlurmCluster

    for limit, lead, want in (("10", 120, 120), ("10", 0, 0), (None, 120, 0),
                              ("UNLIMITED", 120, 0), ("infinite", 120, 0)):
        cluster = SlurmCluster(time_limit=limit, time_limit_lead_s=lead)
        assert cluster.signal_lead_s == want, (limit, lead)
        job = Job(1)
        job.cluster = cluster
        asked = [o for o in script.sbatch_options(job, "/tmp/run") if o.startswith("--signal")]
        assert asked == ([f"--signal=TERM@{want}"] if want else []), (limit, asked)
