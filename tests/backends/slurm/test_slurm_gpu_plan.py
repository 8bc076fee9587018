"""A gpu Slurm job's steps and GPUs, process-free: the srun line, the environment srun gets,
``scontrol -d show job``'s GPU indices, and the ``cluster.env`` names refused.
The real slurmd's side is tests/backends/slurm/test_slurm_gpu.py."""

from __future__ import annotations

import pytest

from launcher import backends, spec as specs
from launcher.backends.slurm import gpus
from launcher.backends.slurm.commands import scrubbed
from launcher.backends.slurm.workers import srun_argv
from launcher.errors import SpecError


def _job(tmp_path, cluster: str):
    path = tmp_path / "job.yaml"
    path.write_text("name: g\ntrain: {num_steps: 2, global_batch_size: 24}\n"
                    f"cluster: {{backend: slurm, {cluster}}}\n")
    return specs.load(str(path), registry=backends)


def test_scontrols_gpu_indices_by_node():
    line = ("JobId=7 JOB_GRES=gpu:4   Nodes=n[1-2] CPU_IDs=2-3 Mem=0 GRES=gpu:2(IDX:1-2) "
            "Nodes=gpu07 CPU_IDs=0 Mem=0 GRES=gpu:a100:2(IDX:0,3),gpu:v100:1(IDX:5) "
            "Nodes=x[08-09] CPU_IDs=0 Mem=0 GRES= MinCPUsNode=2 TresPerTask=gres:gpu:1")
    assert gpus.gpu_indices(line) == {"n1": (1, 2), "n2": (1, 2), "gpu07": (0, 3, 5)}
    assert gpus.gpu_indices("JobId=8 JOB_GRES=(null)") == {}


def test_a_gpu_step_asks_for_every_gpu_of_the_job_on_its_node_and_a_cpu_step_for_none(tmp_path):
    cluster = _job(tmp_path, "platform: gpu, processes_per_node: 2, devices_per_process: 3").cluster
    assert cluster.gpus_per_node == 6
    assert "--gres=gpu:6" in srun_argv("7", "n1", "s", cluster, ("python",))
    cluster = _job(tmp_path, "processes_per_node: 2, devices_per_process: 3").cluster
    assert not any(a.startswith("--gres") for a in srun_argv("7", "n1", "s", cluster, ("python",)))


def test_srun_gets_no_allocation_gpus_and_no_launchers_cuda_visible_devices():
    shell = {"SLURM_GPUS_PER_TASK": "1", "SLURM_GPUS_PER_NODE": "1", "SLURM_TRES_PER_TASK":
             "gres:gpu:1", "SLURM_JOB_ID": "7", "SLURM_CONF": "/c", "CUDA_VISIBLE_DEVICES": "3",
             "HOME": "/h"}
    env = scrubbed(shell, dict(gpus.ENV), drop=gpus.UNSET)
    assert env == {"SLURM_JOB_ID": "7", "SLURM_CONF": "/c", "HOME": "/h",
                   "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_a_process_is_named_its_gpu_by_slurms_index_only_when_slurm_named_them(tmp_path):
    job = _job(tmp_path, "platform: gpu, nodes: 2, processes_per_node: 2")
    placed = gpus.placements(job, "n2", "py", "/r", "/r/job.json", {"A": "1"}, None)
    assert [p.local_device_ids for p in placed] == [(0,), (1,)]
    assert all(p.env == {"A": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"} and
               p.unset == ("CUDA_VISIBLE_DEVICES",) for p in placed)
    assert [gpus.process_gpus(job.cluster, p, {"n2": (1, 2, 3)}) for p in placed] == [(1,), (2,)]
    assert gpus.process_gpus(job.cluster, placed[1], {}) == ()
    assert gpus.process_gpus(job.cluster, placed[1], {"n2": (1,)}) == ()


@pytest.mark.parametrize("name,says", [
    ("SLURM_GPUS_PER_TASK", "would be read by srun as one of its own options"),
    ("SRUN_CPUS_PER_TASK", "would be read by srun as one of its own options"),
    ("CUDA_VISIBLE_DEVICES", "is not yours to set on a gpu job: Slurm sets CUDA_VISIBLE_DEVICES"),
    ("CUDA_DEVICE_ORDER", "is not yours to set on a gpu job"),
])
def test_cluster_env_may_not_shape_the_steps_or_name_their_gpus(tmp_path, name, says):
    with pytest.raises(SpecError) as err:
        _job(tmp_path, f"platform: gpu, env: {{{name}: '1'}}")
    assert f"cluster.env.{name}" in str(err.value) and says in str(err.value), str(err.value)
    _job(tmp_path, "platform: cpu, env: {CUDA_VISIBLE_DEVICES: '1'}")  # a cpu job's own business
