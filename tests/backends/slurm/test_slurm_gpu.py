"""A ``platform: gpu`` Slurm job keeps the GPUs its plan gives each process, on the real Slurm.

The harness's nodes each declare 4 GPUs as generic resources over stand-in device files
(``tests/harness/slurmenv.py``), so slurmd places GPUs and names them to every step
(``CUDA_VISIBLE_DEVICES``, ``SLURM_STEP_GPUS``) as on a GPU node. The workers cannot run JAX
on them: the job is a program (``tests/programs/gpu_report.py``) that reports, from inside each
step, the GPUs it was given and the ``local_device_ids`` podlaunch passed, and exits.

The case of NVFlare #5268 and jax #28194: inside ``salloc --gpus-per-task=1`` (which exports
``SLURM_GPUS_PER_TASK=1``), a one-task step inherits the allocation's per-task request and sees
one GPU, renumbered 0 for JAX, so the planned ``local_device_ids`` 1 of the node's second
process does not exist. A job holding GPU 0 of every node first makes the run's GPUs 1 and 2:
each process must see Slurm's own numbering, not podlaunch's guess.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest

from harness import sshenv
from harness.helpers import LAUNCH, PROGRAMS, REPO, env_for_tests, run_pids
from launcher.backends.slurm.gpus import gpu_indices

pytestmark = pytest.mark.slow

if os.environ.get("PODLAUNCH_SKIP_SLURM") == "1":
    pytest.skip(sshenv.UNAVAILABLE + "PODLAUNCH_SKIP_SLURM=1", allow_module_level=True)

# What salloc --gpus-per-task=1 exports, and more a user's shell may hold: none may reach a step
ALLOCATION_GPUS = {"SLURM_GPUS_PER_TASK": "1", "SLURM_GPUS_PER_NODE": "1",
                   "SLURM_TRES_PER_TASK": "gres:gpu:1", "SLURM_GPUS": "1",
                   "CUDA_VISIBLE_DEVICES": "3"}


def launcher_env(slurm, **extra) -> dict:
    env = {k: v for k, v in env_for_tests().items()
           if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
    return {**env, "SLURM_CONF": str(slurm.conf), **extra}


def job_gpus(slurm, job_id: str) -> dict:
    """node -> the job's GPUs there by Slurm's index, as ``scontrol -d`` says (the same
    parser as the product's, checked on its own in test_slurm_gpu_plan.py)."""
    return gpu_indices(slurm.run("scontrol", "-o", "-d", "show", "job", job_id).splitlines()[0])


def wait_running(slurm, job_id: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while "JobState=RUNNING" not in slurm.run("scontrol", "-o", "show", "job", job_id):
        assert time.monotonic() < deadline, slurm.run("scontrol", "-o", "show", "job", job_id)
        time.sleep(0.2)


def allocate(slurm, *args: str) -> str:
    """``salloc --no-shell ARGS``'s job id, once it runs."""
    done = subprocess.run(["salloc", "--no-shell", *args], env=slurm.env(), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    found = re.search(r"Granted job allocation (\d+)", done.stderr)
    assert done.returncode == 0 and found, done.stderr
    wait_running(slurm, found.group(1))
    return found.group(1)


def reports(run_dir) -> list:
    """Each process's ``gpu-report`` line, read back from its log, by process id."""
    found = []
    for name in sorted(os.listdir(run_dir / "logs")):
        if name.startswith("process-"):
            lines = [line.split("gpu-report ", 1)[1] for line in
                     (run_dir / "logs" / name).read_text().splitlines() if "gpu-report " in line]
            assert len(lines) == 1, (run_dir / "logs" / name).read_text()
            found.append(json.loads(lines[0]))
    return sorted(found, key=lambda r: int(r["PODLAUNCH_PROCESS_ID"]))


@pytest.mark.parametrize("mode", ["allocation", "submit"])
def test_each_step_keeps_the_gpus_of_its_plan_whatever_slurm_gpus_per_task_says(slurm, tmp_path,
                                                                               mode):
    program = tmp_path / "program"
    program.mkdir()
    shutil.copyfile(os.path.join(PROGRAMS, "gpu_report.py"), program / "gpu_report.py")
    spec = tmp_path / "gpus.yaml"
    spec.write_text(f"name: gpus\nprogram: {{argv: [python, gpu_report.py], dir: {program}}}\n")
    cluster = tmp_path / "slurm.yaml"
    cluster.write_text("backend: slurm\nplatform: gpu\nnodes: 2\nprocesses_per_node: 2\n"
                       "devices_per_process: 1\npoll_s: 0.2\ngrace_s: 2\n")
    # GPU 0 of every node taken first: the run's are 1 and 2 by Slurm's index
    blocker = slurm.run("sbatch", "--parsable", "-N3", "--gres=gpu:1", "--job-name=gpu-blocker",
                        "--output=/dev/null", "--wrap", "sleep 600").strip().split(";")[0]
    jobs = [blocker]
    try:
        wait_running(slurm, blocker)
        taken = job_gpus(slurm, blocker)
        assert sorted(taken) == ["n1", "n2", "n3"], taken
        env = {**ALLOCATION_GPUS}
        if mode == "allocation":
            jobs.append(allocate(slurm, "-N2", "--ntasks-per-node=2", "--gpus-per-task=1",
                                 "--job-name=gpu-allocation"))
            env["SLURM_JOB_ID"] = jobs[-1]
            held = job_gpus(slurm, jobs[-1])
            # the trap itself: a one-task step of this allocation, asking for nothing, gets one
            # GPU of Slurm's choice (every step the same one), whatever its environment says
            for node in held:
                seen = slurm.run("srun", f"--jobid={jobs[-1]}", "--nodes=1", "--ntasks=1",
                                 f"--nodelist={node}", "--overlap", "--quiet", "printenv",
                                 "CUDA_VISIBLE_DEVICES").split()
                assert len(seen) == 1 and seen[0] in {str(i) for i in held[node]}, (seen, held)
        args = [str(spec), "--cluster", str(cluster), "--run-dir", str(tmp_path / "run")]
        dry = subprocess.run(LAUNCH + args + ["--dry-run"], cwd=REPO, capture_output=True,
                             text=True, timeout=120, env=launcher_env(slurm, **env),
                             stdin=subprocess.DEVNULL)
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert "#SBATCH --gres=gpu:2" in dry.stdout or mode == "allocation", dry.stdout
        # each process's local_device_ids, and (in an allocation) its GPU by Slurm's index
        said = {p: (ids, gpu) for p, ids, gpu in re.findall(
            r"^  (p\d) n\d: local_device_ids (\d+) of the step's 2 GPUs \(--gres=gpu:2; Slurm's "
            r"CUDA_VISIBLE_DEVICES, in PCI bus order\)(?: = GPU (\d+) of n\d by Slurm's index)?; "
            r"step: .* --gres=gpu:2 ", dry.stdout, re.M)}
        assert sorted(said) == ["p0", "p1", "p2", "p3"], dry.stdout
        # the order is podlaunch's; the list is Slurm's (the shell's CUDA_VISIBLE_DEVICES=3 is not)
        assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in dry.stdout, dry.stdout
        assert not re.search(r"\bCUDA_VISIBLE_DEVICES=", dry.stdout), dry.stdout

        done = subprocess.run(LAUNCH + args + ["--show", "all"], cwd=REPO, capture_output=True,
                              text=True, timeout=180, env=launcher_env(slurm, **env),
                              stdin=subprocess.DEVNULL)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        assert f"({mode}) on n1,n2" in out and "OK: 4 processes succeeded" in out, out
        seen = reports(tmp_path / "run")
        assert [r["PODLAUNCH_PROCESS_ID"] for r in seen] == ["0", "1", "2", "3"], seen
        job_id = seen[0]["SLURM_JOB_ID"]
        if mode == "allocation":
            assert job_id == jobs[-1]
        for r in seen:
            pid = int(r["PODLAUNCH_PROCESS_ID"])
            node, rank = ("n1", "n2")[pid // 2], pid % 2
            free = [g for g in range(slurm.gpus) if g not in taken[node]]
            # the plan: rank r of a node uses local_device_ids r of the step's GPUs, which are
            # the job's two there (every step of the node the same list, Slurm's numbering)
            assert r["SLURMD_NODENAME"] == node and r["SLURM_JOB_ID"] == job_id, r
            assert r["PODLAUNCH_LOCAL_DEVICE_IDS"] == str(rank) == said[f"p{pid}"][0], (r, said)
            assert r["CUDA_VISIBLE_DEVICES"] == r["SLURM_STEP_GPUS"] == \
                ",".join(map(str, free[:2])), (r, taken)
            assert r["gpus"] == [str(free[rank])], r
            assert r["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID", r
            if mode == "allocation":  # the dry run named the same GPU, read from Slurm
                assert said[f"p{pid}"][1] == str(free[rank]), (said, r)
        # two processes of a node never share a GPU
        assert len({(r["SLURMD_NODENAME"], tuple(r["gpus"])) for r in seen}) == 4, seen
        assert not run_pids(str(tmp_path / "run"))
    finally:
        for job_id in jobs:
            slurm.run("scancel", job_id, check=False)
        assert not slurm.wait_queue_empty(15)


def test_an_allocation_with_too_few_gpus_on_a_node_is_bad_input_before_any_step(slurm, tmp_path):
    spec = tmp_path / "gpus.yaml"
    shutil.copyfile(os.path.join(PROGRAMS, "gpu_report.py"), tmp_path / "gpu_report.py")
    spec.write_text("name: gpus\nprogram: {argv: [python, gpu_report.py]}\n")
    cluster = tmp_path / "slurm.yaml"
    cluster.write_text("backend: slurm\nplatform: gpu\nnodes: 2\nprocesses_per_node: 2\n"
                       "devices_per_process: 2\npoll_s: 0.2\n")
    job_id = allocate(slurm, "-N2", "--ntasks-per-node=2", "--gpus-per-task=1",
                      "--job-name=gpu-allocation")
    try:
        done = subprocess.run(LAUNCH + [str(spec), "--cluster", str(cluster), "--run-dir",
                                        str(tmp_path / "run")],
                              cwd=REPO, capture_output=True, text=True, timeout=120,
                              env=launcher_env(slurm, SLURM_JOB_ID=job_id,
                                               SLURM_GPUS_PER_TASK="1"),
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 2, done.stdout + done.stderr
        assert (f"cluster.devices_per_process: 2 processes per node x 2 GPUs need 4 GPUs on every "
                f"node; allocation {job_id} (SLURM_JOB_ID) holds 2 GPUs on n1 (Slurm's 0,1); ask "
                "salloc for --gpus-per-node=4") in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert not slurm.run("squeue", "-h", "-s", "-j", job_id, "-o", "%j").strip()
    finally:
        slurm.run("scancel", job_id, check=False)
        assert not slurm.wait_queue_empty(15)
