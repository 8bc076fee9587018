"""Where the worker's loop spends the host's time: clock sums around its parts, in a real launch.

Runs ``launch jobs/linear.yaml`` in one process on this machine's devices (the 256 x 4 job,
checkpoints off, unless ``--set`` says otherwise) with ``bench/loop_clock/sitecustomize.py``
on the worker's path, which sums ``time.perf_counter`` around the loop's parts (the call's
dispatch, the quiet runs, the log action, the logger's reads and keeps, the early fetch, the
hand-over to the writer thread, ...). Prints, per part, its seconds, its share of the loop
(``Loop.run``, compilation included: ``StepCalls._compile`` says how much), its calls and
microseconds a call, then the run's steps/s from its progress lines. A wrapper costs about
a microsecond a call, so parts called per step inflate a little; nothing in the product
changes. docs/tpu.md ("where the default's time went on the chip") is its use on the v5e.

    python bench/loop_clock.py --platform tpu --steps 2000000
    python bench/loop_clock.py --platform cpu --steps 200000 --set train.steps_per_call=100
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rate(log_path: str, warmup_fraction: float = 0.05) -> float:
    """Steps/s between the first progress line past ``warmup_fraction`` of the steps and the
    last (a log's lines are stamped: ``2026-12-08T00:01:02.345Z step N/M ...``)."""
    points = []
    with open(log_path, encoding="utf-8", errors="replace") as file:
        for line in file:
            match = re.match(r"(\S+)Z step (\d+)/(\d+) ", line)
            if match:
                when = datetime.datetime.fromisoformat(match.group(1)).timestamp()
                points.append((when, int(match.group(2)), int(match.group(3))))
    if len(points) < 2:
        return float("nan")
    first = next(p for p in points if p[1] >= warmup_fraction * points[-1][2])
    last = points[-1]
    return (last[1] - first[1]) / (last[0] - first[0]) if last[0] > first[0] else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", default="cpu", choices=("cpu", "tpu", "gpu"))
    parser.add_argument("--steps", type=int, default=200000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--features", type=int, default=4)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="more of launch's --set (repeatable)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        out, run_dir = os.path.join(folder, "sums"), os.path.join(folder, "run")
        os.makedirs(out)
        sets = [f"cluster.platform={args.platform}", "cluster.num_processes=1",
                f"cluster.devices_per_process={1 if args.platform == 'cpu' else 'null'}",
                f"train.global_batch_size={args.batch}", f"data.num_examples={args.batch}",
                f"data.in_features={args.features}", f"train.num_steps={args.steps}",
                "checkpoint.every_steps=0", *args.set]
        env = {**os.environ, "LOOP_CLOCK_OUT": out, "PYTHONPATH": os.pathsep.join(
            [os.path.join(REPO, "bench", "loop_clock"), REPO, os.environ.get("PYTHONPATH", "")])}
        command = [sys.executable, "-m", "launcher.cli", "jobs/linear.yaml", "--run-dir", run_dir,
                   "--status-every", "0"] + [item for key in sets for item in ("--set", key)]
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"launch failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
        (path,) = glob.glob(os.path.join(out, "*.json"))
        with open(path, encoding="utf-8") as file:
            sums = json.load(file)
        loop = sums.get("Loop.run", [float("nan"), 1])[0]
        print(f"{'part':34s} {'s':>8s} {'of loop':>8s} {'calls':>9s} {'us each':>9s}")
        for name, (seconds, calls) in sorted(sums.items(), key=lambda item: -item[1][0]):
            print(f"{name:34s} {seconds:8.3f} {seconds / loop:8.1%} {calls:9d} "
                  f"{seconds / max(calls, 1) * 1e6:9.1f}")
        steps_per_s = rate(os.path.join(run_dir, "logs", "process-000.log"))
        print(f"steps/s (the first 5% of steps left out): {steps_per_s:,.0f}")


if __name__ == "__main__":
    main()
