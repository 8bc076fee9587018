"""Steps/s of the real worker (``launch``, end to end) against the seed, in one run.

podlaunch side: ``python -m launcher.cli jobs/linear.yaml`` in single-host
debug mode (the local backend: real processes, real ``job.json``, the
worker's own loop, TensorBoard on), ``--steps`` steps, a log line every
``--log-every`` steps, checkpoints off; its steps/s is what the worker
itself reports (process 0's progress lines, read with the launcher's own
parser: wall time per step, compilation excluded).

Baselines (``bench/seed_loop.py``, nothing of podlaunch imported), the same
steps, shapes and devices:

* ``seed``: the seed as written, one process with every device of the
  topology (P x D CPU devices).
* ``seed-mp``: the seed made multi-process by hand: P processes of D
  devices, ``jax.distributed.initialize``, then the seed's loop on each
  process's shard (only for P > 1).

Each round runs every side once, the order reversed every other round
(ABBA), so drift on a shared machine hits every side alike. A ratio is
podlaunch / baseline steps/s within one round; the table gives each side's
median steps/s, and the median (min-max) of the per-round ratios.

    python bench/bench_step.py                                  # 1x4 and 2x2, both shapes
    python bench/bench_step.py --topologies 1x4 --shapes seed --rounds 7
    python bench/bench_step.py --variant k100='--set train.steps_per_call=100'
    python bench/bench_step.py --no-baselines --variant jit='--set train.parallelism=jit'
    python bench/bench_step.py --no-baselines --common '--set train.steps_per_call=100' \
        --variant jit='--set train.parallelism=jit'
    python bench/bench_step.py --topologies 1x1 --shapes seed --steps 20000 --limit 1 \
        --no-baselines --variant jit='--set train.parallelism=jit'   # against the hand loop

Each variant is also compared with the default podlaunch side (``jit /
podlaunch``: jax.jit over a global mesh against pmap, same rounds).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_limit import honest_ratio  # noqa: E402  (bench/step_limit.py, beside this file)
from launcher import logtimes  # noqa: E402  (after the path is set)
from launcher.proctl import free_port  # noqa: E402
from launcher.stats import ProcessStats  # noqa: E402

SHAPES = {  # name: (global batch = rows, features)
    "seed": (256, 4),
    "large": (65536, 256),
}


def _env(devices: int | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PODLAUNCH_", "XLA_"))}
    if devices is not None:
        env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices))
    return env


def run_podlaunch(extra: list, shape: str, processes: int, devices: int, steps: int,
                  log_every: int, workdir: str, tag: str) -> float:
    """One real launch; process 0's own steps/s (compilation excluded)."""
    batch, features = SHAPES[shape]
    run_dir = os.path.join(workdir, tag)
    args = [sys.executable, "-m", "launcher.cli", "jobs/linear.yaml", "--run-dir", run_dir,
            "--show", "none", "--status-every", "0",
            "--set", f"cluster.num_processes={processes}",
            "--set", f"cluster.devices_per_process={devices}",
            "--set", f"train.num_steps={steps}", "--set", f"train.global_batch_size={batch}",
            "--set", f"data.num_examples={batch}", "--set", f"data.in_features={features}",
            "--set", f"logging.log_every_steps={log_every}", "--set", "checkpoint.every_steps=0",
            "--set", "optimizer.learning_rate=0.01", *extra]
    return process0_steps_per_s(args, REPO, run_dir, steps, tag)


def process0_steps_per_s(args: list, cwd: str, run_dir: str, steps: int, tag: str) -> float:
    """Run the launch ``args`` in ``cwd``; process 0's own steps/s from its log (compilation
    excluded), or exit naming ``tag`` when it failed or timed fewer than ``steps`` steps."""
    done = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{tag} failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    stats = ProcessStats()
    for line in logtimes.read_text(os.path.join(run_dir, "logs", "process-000.log")).splitlines():
        stats.observe(line)
    if stats.timed_steps != steps:
        raise SystemExit(f"{tag}: timed {stats.timed_steps} of {steps} steps")
    return 1.0 / stats.mean_step_time_s


def run_limit(shape: str, steps: int, k: int) -> float:
    """The step's limit on one CPU device (bench/step_limit.py): the hand-written loop, K steps
    a call, the batch passed in as a trainer's is, the best of its formulations."""
    batch, features = SHAPES[shape]
    done = subprocess.run([sys.executable, os.path.join(REPO, "bench", "step_limit.py"),
                           "--ks", str(k), "--batch-argument", "--steps", str(steps),
                           "--batch", str(batch), "--features", str(features)],
                          env=_env(1), capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"step_limit failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return float(next(line.split()[2] for line in done.stdout.splitlines()
                      if line.startswith("RATE ")))


def run_seed(shape: str, processes: int, devices: int, steps: int) -> float:
    """The seed's loop: one process of ``devices`` devices, or ``processes`` by hand."""
    batch, features = SHAPES[shape]
    base = [sys.executable, os.path.join(REPO, "bench", "seed_loop.py"), "--steps", str(steps),
            "--batch", str(batch), "--features", str(features)]
    if processes == 1:
        procs = [subprocess.Popen(base, env=_env(devices), stdout=subprocess.PIPE, text=True)]
    else:
        coordinator = f"127.0.0.1:{free_port('127.0.0.1')}"
        procs = [subprocess.Popen(base + ["--num-processes", str(processes), "--process-id", str(i),
                                          "--coordinator", coordinator],
                                  env=_env(devices), stdout=subprocess.PIPE, text=True)
                 for i in range(processes)]
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"seed {processes}x{devices} failed:\n{outs[0][-2000:]}")
    return float(next(line.split()[1] for line in outs[0].splitlines() if line.startswith("RATE ")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", nargs="+", default=["1x4", "2x2"],
                        help="PxD: P processes x D CPU devices each")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000, help="at the seed's shapes")
    parser.add_argument("--large-steps", type=int, default=200, help="at 65,536 x 256")
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME='--set KEY=VALUE ...': another podlaunch side (repeatable)")
    parser.add_argument("--no-default", action="store_true",
                        help="leave out the podlaunch side with the spec's defaults")
    parser.add_argument("--common", default="",
                        help="'--set KEY=VALUE ...' for every podlaunch side (the default's too)")
    parser.add_argument("--no-baselines", action="store_true",
                        help="leave out seed and seed-mp (variants against podlaunch only)")
    parser.add_argument("--limit", type=int, default=0, metavar="K",
                        help="also the step's limit at K steps a call (bench/step_limit.py, one "
                        "CPU device: 1x1 only), each side divided by it (honest_ratio)")
    args = parser.parse_args()
    common = shlex.split(args.common)
    variants = [] if args.no_default else [("podlaunch", common)]
    for text in args.variant:
        name, _, rest = text.partition("=")
        variants.append((name, common + shlex.split(rest)))
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, {args.rounds} rounds (ABBA), "
          f"log every {args.log_every}, checkpoints off; ratio: median (min-max) of per-round "
          f"podlaunch / baseline", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        for shape in args.shapes:
            steps = args.steps if shape == "seed" else args.large_steps
            steps -= steps % args.log_every if steps > args.log_every else 0
            log_every = min(args.log_every, steps)
            for topo in args.topologies:
                processes, devices = (int(v) for v in topo.split("x"))
                sides = [] if args.no_baselines else [
                    ("seed", lambda: run_seed(shape, 1, processes * devices, steps))]
                if processes > 1 and not args.no_baselines:
                    sides.append(("seed-mp", lambda: run_seed(shape, processes, devices, steps)))
                if args.limit:
                    if (processes, devices) != (1, 1):
                        raise SystemExit("--limit: the step's limit runs on one device: 1x1 only")
                    sides.append(("limit", lambda: run_limit(shape, steps, args.limit)))
                for name, extra in variants:
                    sides.append((name, lambda name=name, extra=extra, r=[0]: run_podlaunch(
                        extra, shape, processes, devices, steps, log_every, workdir,
                        f"{shape}-{topo}-{name}-{r.__setitem__(0, r[0] + 1) or r[0]}")))
                rates: dict = {name: [] for name, _ in sides}
                for index in range(args.rounds):
                    for name, fn in (sides if index % 2 == 0 else sides[::-1]):
                        rates[name].append(fn())
                batch, features = SHAPES[shape]
                print(f"\n{batch} x {features}, {topo} ({processes} processes x {devices} CPU "
                      f"devices), {steps} steps:", flush=True)
                for name, _ in sides:
                    print(f"  {name:<14} {statistics.median(rates[name]):9.1f} steps/s  "
                          + " ".join(f"{r:.0f}" for r in rates[name]))
                baselines = [name for name, _ in sides if name.startswith("seed")]
                for name, _ in variants:
                    for base in baselines:
                        ratios = [a / b for a, b in zip(rates[name], rates[base])]
                        print(f"  {name} / {base}: {statistics.median(ratios):.2f}x "
                              f"({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
                    if args.limit:
                        ratios = [honest_ratio(a, b, name)
                                  for a, b in zip(rates[name], rates["limit"])]
                        print(f"  {name} / limit (K={args.limit}): {statistics.median(ratios):.2f}x "
                              f"({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
                    if name != "podlaunch" and not args.no_default:
                        ratios = [a / b for a, b in zip(rates[name], rates["podlaunch"])]
                        print(f"  {name} / podlaunch: {statistics.median(ratios):.2f}x "
                              f"({min(ratios):.2f}-{max(ratios):.2f})", flush=True)


if __name__ == "__main__":
    main()
