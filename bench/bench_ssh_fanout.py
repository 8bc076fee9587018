"""Benchmark the ssh backend's fan-out against a serial ssh loop (prints figures; asserts nothing).

Two measures, for 1, 4 and 16 hosts (127.0.0.2.., one real sshd each, started
here with tests/harness/sshenv.py; needs root and openssh-server):

* fan-out: connect to every host and run ``true``. podlaunch's way (fabric
  connections from a bounded pool, host keys checked) vs. a serial loop of
  ``ssh -F ssh_config HOST true``.
* first step: wall time from the start until every worker has printed
  ``step 1/``. ``launch jobs/linear.yaml`` (preflight included) vs. a serial
  loop that starts each worker with ``ssh HOST 'nohup python -m worker &'``,
  as home-made scripts do, then waits for the step lines in the log files.

Usage: python bench/bench_ssh_fanout.py [--hosts 1 4 16] [--repeat 3]
All hosts are this machine: the first-step figure includes every JAX process
starting on the same CPUs, so it grows with the host count here where a real
cluster would not.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

import yaml  # noqa: E402

from harness import sshenv  # noqa: E402
from launcher import plan as planning  # noqa: E402
from launcher import backends, spec as specs  # noqa: E402
from launcher.backends.ssh import connection as ssh_connection  # noqa: E402
from launcher.backends.ssh.session import SshSession  # noqa: E402

STEP1 = re.compile(r"^(?:\[p(\d+)[^\]]*\] )?step 1/", re.M)


def cluster_file(base: str, env: sshenv.SshTestEnv, hosts: list) -> str:
    path = os.path.join(base, f"cluster-{len(hosts)}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"backend": "ssh", "ssh_config_file": env.ssh_config, "python": sys.executable,
                        "hosts": [{"host": h, "workdir": os.path.join(base, f"h{i}")}
                                  for i, h in enumerate(hosts)],
                        "env": {"PYTHONPATH": REPO}}, f)
    return path


def job_args() -> list:
    return ["--set", "train.num_steps=1", "--set", "logging.log_every_steps=1",
            "--set", "logging.tensorboard=false"]


def fanout_podlaunch(cluster: str, command: str = "true") -> float:
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), cluster, ("train.num_steps=1",),
                     registry=backends)
    start = time.perf_counter()
    hosts = SshSession(job, os.path.join(tempfile.gettempdir(), "bench-run")).ssh.resolve()

    def one(host):
        with host.open() as c:
            status, _ = ssh_connection.run_script(c.transport, command + "\n")
            assert status == 0

    with concurrent.futures.ThreadPoolExecutor(min(32, len(hosts))) as pool:
        list(pool.map(one, hosts))
    return time.perf_counter() - start


def fanout_serial(env: sshenv.SshTestEnv, hosts: list, command: str = "true") -> float:
    start = time.perf_counter()
    for h in hosts:
        subprocess.run(["ssh", "-F", env.ssh_config, h, command], check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - start


def first_step_podlaunch(base: str, cluster: str, run: int) -> float:
    start = time.perf_counter()
    # --show all: every process's step line reaches the console (by default only process 0's)
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "jobs/linear.yaml", "--cluster", cluster,
                             "--run-dir", os.path.join(base, f"run-{run}"), "--show", "all",
                             *job_args()],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    n = len(yaml.safe_load(open(cluster))["hosts"])
    seen, elapsed = set(), None
    for line in proc.stdout:
        m = STEP1.match(line)
        if m:
            seen.add(m.group(1))
            if len(seen) == n and elapsed is None:
                elapsed = time.perf_counter() - start
    if proc.wait() != 0 or elapsed is None:
        raise RuntimeError(f"launch failed (exit {proc.returncode})")
    return elapsed


def first_step_serial(base: str, env: sshenv.SshTestEnv, hosts: list, run: int) -> float:
    """What a home-made script does: one ssh per host, in turn, each starting a worker with nohup."""
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), cluster_file(base, env, hosts),
                     tuple(a for a in job_args() if a != "--set"), registry=backends)
    run_dir = os.path.join(base, f"serial-{run}")
    os.makedirs(run_dir)
    job_path = os.path.join(run_dir, "job.json")
    job.job_file().to_json(job_path)
    port = ssh_free_port()
    start = time.perf_counter()
    logs = []
    for i, h in enumerate(hosts):
        placement = planning.Placement(host=h, num_processes=1, local_device_count=job.local_device_count,
                                       platform="cpu", python=sys.executable, run_dir=run_dir,
                                       job_path=job_path)
        env_vars = planning.worker_env(job, placement, f"{hosts[0]}:{port}", i)
        env_vars["PYTHONPATH"] = REPO
        log = os.path.join(run_dir, f"p{i}.log")
        logs.append(log)
        command = " ".join(["env"] + [f"{k}={shlex.quote(v)}" for k, v in env_vars.items()]
                           + ["nohup", shlex.quote(sys.executable), "-m", "worker",
                              ">", shlex.quote(log), "2>&1", "&"])
        subprocess.run(["ssh", "-F", env.ssh_config, h, command], check=True, stdin=subprocess.DEVNULL)
    while True:
        done = 0
        for log in logs:
            try:
                done += bool(STEP1.search(open(log).read()))
            except OSError:
                pass
        if done == len(logs):
            elapsed = time.perf_counter() - start
            break
        if time.perf_counter() - start > 300:
            raise RuntimeError("serial workers did not reach step 1")
        time.sleep(0.02)
    while any("done" not in open(log).read() for log in logs) and time.perf_counter() - start < 300:
        time.sleep(0.1)
    return elapsed


def ssh_free_port() -> int:
    from launcher.proctl import free_port
    return free_port("127.0.0.2")


def best(fn, repeat: int) -> float:
    return min(fn() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is shown")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as base, sshenv.SshTestEnv(base, max(args.hosts)) as env:
        rows, run = {}, 0
        for n in args.hosts:
            hosts = env.hosts[:n]
            cluster = cluster_file(base, env, hosts)
            fan_p = best(lambda: fanout_podlaunch(cluster), args.repeat)
            fan_s = best(lambda: fanout_serial(env, hosts), args.repeat)
            # a command that waits rather than computes: what fan-out costs when
            # each host has its own CPUs (here all 16 "hosts" share this machine's)
            sleep_p = best(lambda: fanout_podlaunch(cluster, "sleep 1"), args.repeat)
            sleep_s = best(lambda: fanout_serial(env, hosts, "sleep 1"), args.repeat)
            firsts_p, firsts_s = [], []
            for _ in range(args.repeat):
                run += 1
                firsts_p.append(first_step_podlaunch(base, cluster, run))
                firsts_s.append(first_step_serial(base, env, hosts, run))
            rows[n] = (fan_p, fan_s, sleep_p, sleep_s, min(firsts_p), min(firsts_s))
            print(f"{n:>2} hosts: " + " ".join(f"{x:.3f}" for x in rows[n]), flush=True)
        one = rows[min(rows)]
        names = ("fan-out `true`", "fan-out `sleep 1`", "until every worker's first step")
        print("\n| measure | hosts | podlaunch (s) | serial ssh loop (s) | podlaunch vs 1 host | "
              "serial vs 1 host | serial / podlaunch |")
        print("|---|---|---|---|---|---|---|")
        for k, name in enumerate(names):
            for n, row in rows.items():
                p, q = row[2 * k], row[2 * k + 1]
                print(f"| {name} | {n} | {p:.3f} | {q:.3f} | {p / one[2 * k]:.2f}x | "
                      f"{q / one[2 * k + 1]:.2f}x | {q / p:.2f}x |")
        print(f"\ncpus: {os.cpu_count()}; best of {args.repeat}; target: 16 hosts within 1.5x of 1 host")


if __name__ == "__main__":
    main()
