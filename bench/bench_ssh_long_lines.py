"""Over ssh: the same bytes of output as one long line vs. as short lines (prints figures; asserts nothing).

One real sshd host (127.0.0.2, tests/harness/sshenv.py; needs root and openssh-server)
runs ``launch jobs/linear.yaml`` end to end with one process, whose first
step ends with it printing ``--mb`` MiB of ``x`` (tests/programs/faulty_task.py):

* ``none``: prints nothing (the run's own cost);
* ``short``: in 100-byte lines;
* ``long``: as one line, one newline at its end.

Each round runs the three back to back, in an order that rotates from round to
round (no order bias; drift on a shared machine hits all alike). Printed: the
median wall seconds of each side and their spread (min-max), the median of the
rounds' long/short ratios, and the same ratio for the printing alone (each
side's time less the round's ``none``). Issue 12 item 14 measured 95 s for a
100 MB line against 14 s for the same bytes in short lines before the fix.

Usage: python bench/bench_ssh_long_lines.py [--mb 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

import yaml  # noqa: E402

from harness import sshenv  # noqa: E402

SIDES = {"none": None, "short": 100, "long": 0}


def cluster_file(base: str, env: sshenv.SshTestEnv) -> str:
    path = os.path.join(base, "cluster.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"backend": "ssh", "ssh_config_file": env.ssh_config, "python": sys.executable,
                        "hosts": [{"host": env.hosts[0], "workdir": os.path.join(base, "h0")}],
                        "processes_per_host": 1, "keepalive_interval_s": 1, "keepalive_timeout_s": 4,
                        "env": {"PYTHONPATH": os.pathsep.join([os.path.join(REPO, "tests", "programs"), REPO])}}, f)
    return path


def run_once(base: str, cluster: str, side: str, mb: int, index: int) -> float:
    """One launch; returns its wall seconds (it must succeed)."""
    args = [sys.executable, "-m", "launcher.cli", "jobs/linear.yaml", "--cluster", cluster,
            "--run-dir", os.path.join(base, f"run-{side}-{index}"), "--status-every", "0",
            "--set", "train.num_steps=5", "--set", "logging.tensorboard=false",
            "--set", "task.name=faulty_task:make"]
    if SIDES[side] is not None:
        args += ["--set", f"task.args.print_mb={mb}", "--set", f"task.args.print_line_bytes={SIDES[side]}"]
    started = time.monotonic()
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{side} failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.mb} MiB over ssh, 1 host, {args.rounds} rounds, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as base, sshenv.SshTestEnv(base, 1) as env:
        cluster = cluster_file(base, env)
        times: dict = {side: [] for side in SIDES}
        order = list(SIDES)
        for index in range(args.rounds):
            for side in order[index % 3:] + order[:index % 3]:
                times[side].append(run_once(base, cluster, side, args.mb, index))
        print(f"{'side':<8} {'median s':>9} {'min s':>8} {'max s':>8}")
        for side, values in times.items():
            print(f"{side:<8} {statistics.median(values):>9.2f} {min(values):>8.2f} {max(values):>8.2f}")
        ratios = [lo / sh for lo, sh in zip(times["long"], times["short"])]
        printing = [(lo - no) / (sh - no) for lo, sh, no in zip(times["long"], times["short"], times["none"])]
        print(f"long/short, whole run:    median {statistics.median(ratios):.3f} "
              f"(rounds: {' '.join(f'{r:.3f}' for r in ratios)})")
        print(f"long/short, printing only: median {statistics.median(printing):.3f} "
              f"(rounds: {' '.join(f'{r:.3f}' for r in printing)})")


if __name__ == "__main__":
    main()
