"""Time from the command to step 1 on 3 Slurm nodes: `launch` against a hand-written srun.

Both sides run the same worker (`python -m worker`) on a real Slurm cluster on
this machine (tests/harness/slurmenv.py: munged, slurmctld and 3 slurmd), 3 processes
x 1 CPU device, in the same allocation of 3 nodes:

* podlaunch: `launch jobs/linear.yaml --cluster <slurm, allocation mode>` as a user
  runs it inside the allocation (SLURM_JOB_ID set): spec check, one srun step per
  process started at once, each worker's facts checked (versions, a free
  coordinator port) while the workers import jax, supervision.
* by hand: what a user writes without podlaunch: job.json written once beforehand
  (not timed), then one `srun -N3 --ntasks-per-node=1` in the allocation whose
  tasks set their process id from SLURM_PROCID and start the worker.

Each round gets one allocation (`salloc -N3 --no-shell`, granted before either
clock starts: the scheduler's grant time is the same for both sides and is not
podlaunch's; on this machine it varies from about 0.9 to 2.9 s and drowned the
difference when it was timed) and runs both sides in it back to back, in
alternating order (ABBA); the clock runs from starting the command to the
first "step 1/" line it prints. The median of the per-round ratios is printed
with their spread (this machine is shared: ratios hold, absolute times drift).
Needs root and Debian's slurm-wlm and munge (.ci/run installs them).

    python bench/bench_slurm.py --rounds 8
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from harness import slurmenv  # noqa: E402
from launcher import backends, spec as specs  # noqa: E402
from launcher.proctl import free_port  # noqa: E402
from worker import contract  # noqa: E402

STEP1 = re.compile(r"step 1/")
ARGS = ("--set", "train.num_steps=200", "--set", "logging.log_every_steps=1",
        "--set", "checkpoint.every_steps=0", "--set", "train.global_batch_size=255")


def _env(env: slurmenv.SlurmTestEnv, job_id: str | None = None) -> dict:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "JAX_", "PODLAUNCH_"))}
    base["SLURM_CONF"] = str(env.conf)
    base["PYTHONPATH"] = REPO
    if job_id:
        base["SLURM_JOB_ID"] = job_id  # what salloc's shell would set; allocation mode reads it
    return base


def _until_step1(argv: list, env: dict) -> float:
    """Seconds from starting ``argv`` to its first step-1 line; the run is then stopped."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        for line in proc.stdout:
            if STEP1.search(line):
                return time.perf_counter() - started
        raise RuntimeError(f"{argv[:4]} ended without a step 1 line (exit {proc.wait()})")
    finally:
        # launch stops its steps on SIGTERM; srun kills its step on SIGTERM
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def _steps_gone(env: slurmenv.SlurmTestEnv, job_id: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while env.run("squeue", "-h", "-s", "-j", job_id, "-o", "%i", check=False).strip():
        if time.monotonic() > deadline:
            raise RuntimeError(f"steps of job {job_id} still listed after {timeout_s} s")
        time.sleep(0.1)


def allocate(env: slurmenv.SlurmTestEnv) -> str:
    """A granted allocation of the 3 nodes (``salloc --no-shell`` returns once it is); its id."""
    result = subprocess.run(["salloc", "-N3", "--no-shell"], env=_env(env), capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL)
    granted = re.search(r"Granted job allocation (\d+)", result.stderr)
    if result.returncode != 0 or not granted:
        raise RuntimeError(f"salloc --no-shell failed (exit {result.returncode}): {result.stderr}")
    return granted.group(1)


def podlaunch(env: slurmenv.SlurmTestEnv, job_id: str, cluster: str, base: str, n: int) -> float:
    argv = [sys.executable, "-m", "launcher.cli", "jobs/linear.yaml", "--cluster", cluster,
            "--run-dir", os.path.join(base, f"launch-{n}"), *ARGS]
    return _until_step1(argv, _env(env, job_id))


def by_hand(env: slurmenv.SlurmTestEnv, job_id: str, job_path: str, base: str, n: int) -> float:
    run_dir = os.path.join(base, f"hand-{n}")
    os.makedirs(run_dir)
    exports = {
        "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1", "PYTHONUNBUFFERED": "1",
        contract.COORDINATOR_ADDRESS: f"127.0.0.1:{free_port('127.0.0.1')}",
        contract.NUM_PROCESSES: "3", contract.LOCAL_DEVICE_COUNT: "1", contract.PLATFORM: "cpu",
        contract.JOB: job_path, contract.RUN_DIR: run_dir,
    }
    task = (" ".join(f"{k}={shlex.quote(v)}" for k, v in exports.items())
            + f" {contract.PROCESS_ID}=$SLURM_PROCID exec {shlex.quote(sys.executable)} -m worker")
    argv = ["srun", f"--jobid={job_id}", "-N3", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            "bash", "-c", task]
    return _until_step1(argv, _env(env, job_id))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    why = slurmenv.available()
    if why:
        sys.exit(f"bench_slurm: Slurm cannot run here: {why}")
    with tempfile.TemporaryDirectory() as base, slurmenv.SlurmTestEnv(num_nodes=3) as env:
        cluster = os.path.join(base, "slurm.yaml")
        with open(cluster, "w", encoding="utf-8") as f:
            f.write("backend: slurm\nmode: allocation\nnodes: 3\nprocesses_per_node: 1\n"
                    "devices_per_process: 1\npoll_s: 0.2\n")
        job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), cluster, ARGS[1::2], registry=backends)
        job_path = os.path.join(base, "job.json")
        job.job_file().to_json(job_path)
        ratios, ours, hands = [], [], []
        for n in range(args.rounds):
            order = ("launch", "hand") if n % 4 in (0, 3) else ("hand", "launch")
            job_id = allocate(env)
            got = {}
            try:
                for side in order:
                    got[side] = (podlaunch(env, job_id, cluster, base, n) if side == "launch"
                                 else by_hand(env, job_id, job_path, base, n))
                    _steps_gone(env, job_id)
            finally:
                env.run("scancel", job_id, check=False)
                env.wait_queue_empty(30)
            ours.append(got["launch"])
            hands.append(got["hand"])
            ratios.append(got["launch"] / got["hand"])
            print(f"round {n + 1} ({order[0]} first): launch {got['launch']:.2f} s, srun by hand "
                  f"{got['hand']:.2f} s, ratio {ratios[-1]:.3f}", flush=True)
        print(f"median: launch {statistics.median(ours):.2f} s, srun by hand "
              f"{statistics.median(hands):.2f} s to step 1; launch / hand = "
              f"{statistics.median(ratios):.3f} (median of per-round ratios, rounds "
              f"{min(ratios):.2f}-{max(ratios):.2f}; goal <= 1.2)")


if __name__ == "__main__":
    main()
