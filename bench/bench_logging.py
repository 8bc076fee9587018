"""Steps/s with everything logged every step, against logging off, in one run.

"on":  logging.log_every_steps=1 and logging.tensorboard=true: every step is
       read back (once finished, in batches at most every 0.25 s: no extra
       sync), prints a progress line, posts every process's own step time to
       process 0 (the coordination service's key-value store), and process 0
       writes every TensorBoard scalar and a metrics.jsonl line.
"off": logging.tensorboard=false and one log step, the last.

Each side is a real ``launch`` of jobs/linear.yaml (2 processes x 1 CPU
device by default). Each round runs both sides back to back (off, on; then
on, off: no order bias), so drift on a shared machine hits both alike.
Steps/s comes from process 0's progress lines (wall seconds per step,
compilation excluded), read with the launcher's own parser. The ratio is
on / off (1.0 = logging is free): the median of the rounds' ratios, and
the ratio of each side's best round (as ``timeit`` advises: on a shared
machine other load only ever slows a run down, so the fastest round is the
closest to the code's own speed).

    python bench/bench_logging.py                      # seed shape and 65,536 x 256
    python bench/bench_logging.py --rounds 5 --shapes large
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.bench_step import process0_steps_per_s  # noqa: E402  (after the path is set)

SHAPES = {
    # name: (global_batch_size = num_examples, in_features, num_steps)
    "seed": (256, 4, 2000),
    "large": (65536, 256, 600),
}
SIDES = {
    "off": ["--set", "logging.tensorboard=false", "--set", "logging.log_every_steps={num_steps}"],
    "on": ["--set", "logging.tensorboard=true", "--set", "logging.log_every_steps=1"],
}


def run_once(shape: str, side: str, processes: int, devices: int, workdir: str, index: int) -> float:
    """One launch; returns process 0's steps/s (compilation excluded)."""
    batch, features, num_steps = SHAPES[shape]
    run_dir = os.path.join(workdir, f"{shape}-{side}-{index}")
    args = [sys.executable, "-m", "launcher.cli", "jobs/linear.yaml", "--run-dir", run_dir,
            "--show", "none", "--status-every", "0",
            "--set", f"cluster.num_processes={processes}", "--set", f"cluster.devices_per_process={devices}",
            "--set", f"train.num_steps={num_steps}", "--set", f"train.global_batch_size={batch}",
            "--set", f"data.num_examples={batch}", "--set", f"data.in_features={features}"]
    args += [a.format(num_steps=num_steps) for a in SIDES[side]]
    return process0_steps_per_s(args, REPO, run_dir, num_steps, f"{shape}/{side}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1,
                        help="CPU devices per process (default 1: see docs/monitoring.md on the gloo hang)")
    args = parser.parse_args()
    print(f"{args.processes} processes x {args.devices} CPU devices, {args.rounds} rounds, "
          f"{os.cpu_count()} cores; median steps/s per side; on/off: median of the rounds' ratios")
    print(f"{'shape':<28} {'off steps/s':>12} {'on steps/s':>12} {'on/off':>8}")
    with tempfile.TemporaryDirectory() as workdir:
        for shape in args.shapes:
            rates: dict = {"off": [], "on": []}
            for index in range(args.rounds):
                for side in ("off", "on") if index % 2 == 0 else ("on", "off"):  # ABBA: no order bias
                    rates[side].append(run_once(shape, side, args.processes, args.devices, workdir, index))
            off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
            ratios = [b / a for a, b in zip(rates["off"], rates["on"])]
            batch, features, num_steps = SHAPES[shape]
            label = f"{shape} ({batch} x {features}, {num_steps} st)"
            print(f"{label:<28} {off:>12.1f} {on:>12.1f} {statistics.median(ratios):>8.3f}", flush=True)
            print(f"{'':<28} per round on/off: " + " ".join(f"{r:.3f}" for r in ratios), flush=True)
            best_off, best_on = max(rates["off"]), max(rates["on"])
            print(f"{'':<28} best of {args.rounds}: off {best_off:.1f}, on {best_on:.1f} steps/s, "
                  f"on/off {best_on / best_off:.3f}", flush=True)


if __name__ == "__main__":
    main()
