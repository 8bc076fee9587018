"""The streaming input pipeline, end to end: memory per worker and steps/s.

``memory``: writes a .npy of at least ``--size-gb`` GB (float32, 64 feature
columns and a target) under ``--dir``, trains on it with 2 processes x 1 CPU
device through ``launch`` (300 steps of 4,096 rows, shuffled: random rows
all over the file), samples ``RssAnon`` and ``RssFile`` of each worker from
/proc/PID/status every 0.1 s, prints the peaks, and deletes the file.
(Pages of a memory-mapped file are file cache, ``RssFile``; what a worker
holds of its own is ``RssAnon``.)

``speed``: steps/s of this tree's worker against another tree's (``--baseline``,
e.g. a checkout of main, whose worker holds every batch on its devices), the
same job, 2 processes x 2 CPU devices, ABBA rounds; ratio = median (min-max)
of per-round this / baseline. Shapes: ``seed`` (256 x 4, one batch per epoch),
``large`` (65,536 x 256, one batch), ``seed-64`` (64 batches of 256 x 4 per
epoch, so this tree streams them) and ``large-4`` (4 batches of 65,536 x 256).

    python bench/bench_data.py memory --size-gb 8
    python bench/bench_data.py speed --baseline /work/main --rounds 3
    python bench/bench_data.py speed --baseline /work/main --shapes large-4 \
        --extra='--set data.resident=true'
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.bench_step import _env, process0_steps_per_s  # noqa: E402  (after the path is set)
from launcher import proctl  # noqa: E402

SHAPES = {  # name: (global batch, features, batches per epoch, steps)
    "seed": (256, 4, 1, 3000),
    "large": (65536, 256, 1, 200),
    "seed-64": (256, 4, 64, 3000),
    "large-4": (65536, 256, 4, 200),
}


def _status(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _workers(run_dir: str) -> list[int]:
    """Pids of ``python -m worker`` processes whose environment names ``run_dir``."""
    needle = f"PODLAUNCH_RUN_DIR={run_dir}".encode()
    return [pid for pid in proctl.pids()
            if needle in proctl.environ(pid) and " -m worker" in proctl.cmdline(pid, 400)]


def write_npy(path: str, size_gb: float, columns: int = 65) -> int:
    """A float32 ``[rows, columns]`` .npy of about ``size_gb`` GB (10**9 bytes); returns rows.

    The last column is ``x @ w + noise``, written chunk by chunk (never all in memory).
    """
    rows = int(size_gb * 1e9) // (columns * 4) + 1
    table = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, columns))
    rng = np.random.default_rng(0)
    w = rng.standard_normal(columns - 1).astype(np.float32)
    chunk = 1 << 20
    for start in range(0, rows, chunk):
        stop = min(rows, start + chunk)
        x = rng.standard_normal((stop - start, columns - 1), dtype=np.float32)
        table[start:stop, :-1] = x
        table[start:stop, -1] = x @ w + 0.1 * rng.standard_normal(stop - start, dtype=np.float32)
    table.flush()
    del table
    return rows


def memory(args) -> None:
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, "podlaunch-bench-data.npy")
    started = time.monotonic()
    rows = write_npy(path, args.size_gb)
    print(f"wrote {path}: {rows} rows x 65 float32, {os.path.getsize(path) / 1e9:.2f} GB "
          f"in {time.monotonic() - started:.0f} s", flush=True)
    spec = os.path.join(args.dir, "podlaunch-bench-data.yaml")
    with open(spec, "w", encoding="utf-8") as f:
        f.write("name: bench-data\n"
                f"data: {{source: file, path: {path}, shuffle: {str(args.shuffle).lower()}}}\n"
                "optimizer: {name: sgd, learning_rate: 0.001}\n"
                f"train: {{num_steps: {args.steps}, global_batch_size: 4096}}\n"
                "logging: {log_every_steps: 50}\ncheckpoint: {every_steps: 0}\n"
                "cluster: {backend: local, num_processes: 2, devices_per_process: 1}\n")
    run_dir = os.path.join(tempfile.mkdtemp(prefix="podlaunch-bench-", dir=args.dir), "run")
    peaks: dict = {}
    done = threading.Event()

    def sample():
        while not done.is_set():
            for pid in _workers(run_dir):
                try:
                    now = _status(pid)
                except OSError:
                    continue
                peak = peaks.setdefault(pid, {})
                for key, value in now.items():
                    peak[key] = max(peak.get(key, 0), value)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = subprocess.run([sys.executable, "-m", "launcher.cli", spec, "--run-dir", run_dir,
                                 "--status-every", "0"], cwd=REPO, env=_env(),
                                capture_output=True, text=True, timeout=3600)
    finally:
        done.set()
        sampler.join()
        os.unlink(path)
    if result.returncode != 0:
        raise SystemExit(f"launch failed:\n{result.stdout[-3000:]}{result.stderr[-2000:]}")
    print("\n".join(line for line in result.stdout.splitlines()
                    if "memory" in line or "process 0:" in line or "OK:" in line))
    gib = 1 << 30
    for pid, peak in sorted(peaks.items()):
        print(f"worker pid {pid}: peak RssAnon {peak['RssAnon'] / gib:.3f} GiB, "
              f"peak RssFile {peak['RssFile'] / gib:.3f} GiB, VmHWM {peak['VmHWM'] / gib:.3f} GiB")


def run(repo: str, python: str, shape: str, workdir: str, tag: str, extra: list,
        large_steps: int = 200) -> float:
    """One launch from ``repo`` with ``python``; process 0's own steps/s (compilation excluded)."""
    batch, features, count, steps = SHAPES[shape]
    steps = large_steps if batch > 256 else steps
    run_dir = os.path.join(workdir, tag)
    args = [python, "-m", "launcher.cli", "jobs/linear.yaml", "--run-dir", run_dir,
            "--show", "none", "--status-every", "0",
            "--set", "cluster.num_processes=2", "--set", "cluster.devices_per_process=2",
            "--set", f"train.num_steps={steps}", "--set", f"train.global_batch_size={batch}",
            "--set", f"data.num_examples={batch * count}", "--set", f"data.in_features={features}",
            "--set", f"logging.log_every_steps={20 if batch > 256 else 100}",
            "--set", "checkpoint.every_steps=0",
            "--set", "optimizer.learning_rate=0.01", *extra]
    return process0_steps_per_s(args, repo, run_dir, steps, tag)


def speed(args) -> None:
    baseline_python = args.baseline_python or os.path.join(args.baseline, ".venv", "bin", "python")
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, {args.rounds} rounds (ABBA), "
          f"2 x 2; this tree / {args.baseline}: median (min-max) of per-round ratios", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        for shape in args.shapes:
            ratios, mine_all, theirs_all = [], [], []
            for r in range(args.rounds):
                sides = [("this", lambda t: run(REPO, sys.executable, shape, workdir, t, args.extra,
                                                args.large_steps)),
                         ("base", lambda t: run(args.baseline, baseline_python, shape, workdir, t,
                                                [], args.large_steps))]
                got = {}
                for name, side in (sides if r % 2 == 0 else sides[::-1]):
                    got[name] = side(f"{shape}-{name}-{r}")
                ratios.append(got["this"] / got["base"])
                mine_all.append(got["this"])
                theirs_all.append(got["base"])
                print(f"  {shape} round {r}: this {got['this']:.1f} steps/s, "
                      f"baseline {got['base']:.1f}", flush=True)
            print(f"{shape}: this {statistics.median(mine_all):.1f} steps/s, baseline "
                  f"{statistics.median(theirs_all):.1f}; ratio {statistics.median(ratios):.3f} "
                  f"({min(ratios):.3f}-{max(ratios):.3f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("memory")
    m.add_argument("--size-gb", type=float, default=8.0)
    m.add_argument("--dir", default="/tmp")
    m.add_argument("--steps", type=int, default=300)
    m.add_argument("--no-shuffle", dest="shuffle", action="store_false")
    s = sub.add_parser("speed")
    s.add_argument("--baseline", required=True, help="another checkout (e.g. main's)")
    s.add_argument("--baseline-python", help="default: BASELINE/.venv/bin/python")
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    s.add_argument("--extra", type=shlex.split, default=[],
                   help="'--set KEY=VALUE ...' for this tree's side")
    s.add_argument("--large-steps", type=int, default=200, help="steps at 65,536 x 256")
    args = parser.parse_args()
    (memory if args.what == "memory" else speed)(args)


if __name__ == "__main__":
    main()
