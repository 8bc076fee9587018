"""The ray backend's cost against the ssh backend's on this machine (prints figures; asserts
nothing).

For 2 and 4 processes of 1 CPU device, each backend on this machine's loopback addresses:

* ray: a head (no CPUs) and two worker nodes on 127.0.0.2-3 (tests/harness/rayenv.py), the
  run's bundles SPREAD over them;
* ssh: one real sshd per host on 127.0.0.2.. (tests/harness/sshenv.py; needs root and
  openssh-server), a process per host.

Two figures per run, best of ``--repeat``:

* first step: wall time from ``launch`` until every process printed ``step 1/`` (preflight,
  placement group and actors included for ray; connections and preflight for ssh);
* cost per process: the CPU seconds the launcher's side paid per process, the launcher's own
  and (ray) the actor each bundle runs, read from /proc before and after (the JAX workers
  themselves are the same on both and are left out), and the actor's resident memory.

Usage: python bench/bench_ray_launch.py [--processes 2 4] [--repeat 3]
Every node and host is this machine: the figures include every JAX process starting on the
same two cores, so they grow with the process count here where a real cluster's would not.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

import yaml  # noqa: E402

from harness import rayenv, sshenv  # noqa: E402

STEP1 = re.compile(r"^(?:\[p(\d+)[^\]]*\] )?step 1/", re.M)
TICKS = os.sysconf("SC_CLK_TCK")


def job_args() -> list:
    return ["--set", "train.num_steps=5", "--set", "logging.log_every_steps=1",
            "--set", "logging.tensorboard=false", "--set", "cluster.devices_per_process=1"]


def ray_cluster(base: str, env: rayenv.RayTestEnv, n: int) -> str:
    path = os.path.join(base, f"ray-{n}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"backend": "ray", "address": env.address, "num_processes": n,
                        "cpus_per_process": 0.5, "env": {"PYTHONPATH": REPO}}, f)
    return path


def ssh_cluster(base: str, env: sshenv.SshTestEnv, n: int) -> str:
    path = os.path.join(base, f"ssh-{n}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"backend": "ssh", "ssh_config_file": env.ssh_config,
                        "python": sys.executable,
                        "hosts": [{"host": h, "workdir": os.path.join(base, f"h{i}")}
                                  for i, h in enumerate(env.hosts[:n])],
                        "env": {"PYTHONPATH": REPO}}, f)
    return path


def actor_cpu() -> tuple:
    """(CPU seconds, resident MiB) of the run's Ray actors alive now (``ray::ProcessHost``)."""
    cpu, rss = 0.0, 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if not f.read().startswith(b"ray::ProcessHost"):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / TICKS
            rss += int(fields[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        except OSError:
            continue
    return cpu, rss


def first_step(base: str, cluster: str, n: int, run: str) -> tuple:
    """(seconds to every process's step 1, launcher CPU-s, actors' CPU-s, actors' MiB)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "jobs/linear.yaml",
                             "--cluster", cluster, "--run-dir", os.path.join(base, run),
                             "--show", "all", *job_args()],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    seen, elapsed, actors = set(), None, (0.0, 0.0)
    for line in proc.stdout:
        m = STEP1.match(line)
        if m:
            seen.add(m.group(1))
            if len(seen) == n and elapsed is None:
                elapsed = time.perf_counter() - start
                actors = actor_cpu()  # before the run ends and Ray kills them
    launcher = os.wait4(proc.pid, 0)[2]
    if elapsed is None:
        raise RuntimeError(f"launch failed: {cluster}")
    return elapsed, launcher.ru_utime + launcher.ru_stime, *actors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    most = max(args.processes)
    with tempfile.TemporaryDirectory() as base, \
            rayenv.RayTestEnv(head_cpus=0, worker_cpus=(most // 2 + 1, most // 2 + 1)) as ray, \
            sshenv.SshTestEnv(base, most) as ssh:
        print("backend  processes  first step s  launcher CPU-s/process  actor CPU-s/process  "
              "actor MiB/process")
        for n in args.processes:
            for name, cluster in (("ssh", ssh_cluster(base, ssh, n)),
                                  ("ray", ray_cluster(base, ray, n))):
                runs = [first_step(base, cluster, n, f"{name}-{n}-{r}")
                        for r in range(args.repeat)]
                best = min(runs)
                print(f"{name:7}  {n:9}  {best[0]:12.2f}  {best[1] / n:22.2f}  "
                      f"{best[2] / n:19.2f}  {best[3] / n:17.0f}")


if __name__ == "__main__":
    main()
