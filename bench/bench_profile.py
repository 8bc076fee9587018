"""Steps/s with a profile configured, outside its traced steps, against no profile section; and
what the traced steps cost, in one run.

"off": jobs/linear.yaml as it is (no profile section).
"on":  profile.start_step = num_steps - 9, profile.num_steps = 10: every process traces its
       last 10 steps with jax.profiler (worker/telemetry/profiler.py) and writes its trace into
       <run dir>/tensorboard/plugins/profile/.
Each side is a real ``launch`` (2 processes x 1 CPU device by default), back to back in ABBA
order per round. Steps/s is process 0's over steps 1 to num_steps - 10 (the steps before the
window, on both sides: what a configured profile costs the steps it does not trace), from its
progress lines, compilation excluded, read with the launcher's own parser. The ratio is on /
off (1.0 = free). The cost when on: the traced steps' ms per step (each process's profile line:
wall time from the trace's start to its last step done, the export excluded) against off's.

    python bench/bench_profile.py
    python bench/bench_profile.py --rounds 7 --steps 3000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.bench_step import _env  # noqa: E402  (after the path is set)
from launcher import logtimes  # noqa: E402
from launcher.stats import ProcessStats  # noqa: E402
from worker.contract import wire  # noqa: E402
from worker.contract import profiling

TRACED = 10


def run_once(side: str, steps: int, processes: int, devices: int, workdir: str, index: int) -> tuple:
    """One launch; returns (process 0's steps/s before the window, traced ms per step or None)."""
    run_dir = os.path.join(workdir, f"{side}-{index}")
    args = [sys.executable, "-m", "launcher.cli", "jobs/linear.yaml", "--run-dir", run_dir,
            "--show", "none", "--status-every", "0", "--set", f"train.num_steps={steps}",
            "--set", f"cluster.num_processes={processes}", "--set", f"cluster.devices_per_process={devices}"]
    if side == "on":
        args += ["--set", f"profile.start_step={steps - TRACED + 1}", "--set", f"profile.num_steps={TRACED}"]
    done = subprocess.run(args, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{side} failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    stats, traced = ProcessStats(), None
    for line in logtimes.read_text(os.path.join(run_dir, "logs", "process-000.log")).splitlines():
        progress = wire.parse(line)
        if isinstance(progress, wire.Progress) and progress.step <= steps - TRACED:
            stats.observe(line)
        if (trace := profiling.parse(line)) is not None:
            traced = trace.ms_per_step
    if stats.timed_steps != steps - TRACED:
        raise SystemExit(f"{side}: timed {stats.timed_steps} of {steps - TRACED} steps")
    if side == "on" and traced is None:
        raise SystemExit("on: process 0 said no trace")
    return 1.0 / stats.mean_step_time_s, traced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1)
    args = parser.parse_args()
    print(f"{args.processes} processes x {args.devices} CPU devices, seed shape (256 x 4), "
          f"{args.steps} steps, {args.rounds} rounds, {os.cpu_count()} cores")
    rates: dict = {"off": [], "on": []}
    traced = []
    with tempfile.TemporaryDirectory() as workdir:
        for index in range(args.rounds):
            for side in ("off", "on") if index % 2 == 0 else ("on", "off"):  # ABBA: no order bias
                rate, ms = run_once(side, args.steps, args.processes, args.devices, workdir, index)
                rates[side].append(rate)
                if ms is not None:
                    traced.append(ms)
    ratios = [b / a for a, b in zip(rates["off"], rates["on"])]
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(f"steps/s before the window: off {off:.1f}, on {on:.1f}; on/off median of rounds "
          f"{statistics.median(ratios):.3f} (per round: {' '.join(f'{r:.3f}' for r in ratios)}); "
          f"best of {args.rounds}: on/off {max(rates['on']) / max(rates['off']):.3f}")
    print(f"traced steps: {statistics.median(traced):.2f} ms per step (median of rounds) against "
          f"{1e3 / off:.2f} untraced: x{statistics.median(traced) * off / 1e3:.2f} while tracing")


if __name__ == "__main__":
    main()
