"""The launcher's cost per worker line: this checkout against an earlier one, in one run.

Each side is one real ``launch jobs/linear.yaml`` in single-host debug mode (2 processes
x 1 CPU device, 5 steps, TensorBoard off) whose process 1, a process the default view
hides, prints ``--mb`` MiB in ``--line-bytes``-byte lines after its first step
(``task.name: bench_lines:make``), and the same launch printing nothing (``none``). The
checkouts: this one, and ``--baseline`` (a commit, checked out into a temporary git
worktree and run from there with this machine's Python and packages). Rounds alternate
the order (ABBA). Printed per checkout: the median wall seconds of the launch that prints
and of the one that does not, and their difference (the printing's cost); then the
ratio of the printing's cost, this checkout over the baseline, median (min-max) over the
rounds.

    python bench/bench_lines.py --rounds 3                    # against 294a0e8
    python bench/bench_lines.py --baseline HEAD~3 --mb 20
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
BENCH = os.path.join(REPO, "bench")


def make(print_mb: int = 0, line_bytes: int = 100, process_id: int = 1):
    """The seed's linear task; after step 1, process ``process_id`` prints ``print_mb`` MiB
    in lines of ``line_bytes`` bytes (newline included)."""
    from worker import tasks

    def on_step_end(step: int, me: int) -> None:
        if step == 1 and me == process_id and print_mb:
            line = "x" * (line_bytes - 1) + "\n"
            block = line * max(1, (1 << 20) // line_bytes)
            for _ in range(print_mb):
                sys.stdout.write(block)
            sys.stdout.flush()

    return tasks.Task(init_params=tasks.init_linear, loss_fn=tasks.mse, on_step_end=on_step_end)


def launch(checkout: str, workdir: str, mb: int, line_bytes: int, tag: str) -> float:
    argv = [sys.executable, "-m", "launcher.cli", os.path.join(checkout, "jobs", "linear.yaml"),
            "--run-dir", os.path.join(workdir, tag), "--status-every", "0",
            "--set", "cluster.num_processes=2", "--set", "cluster.devices_per_process=1",
            "--set", "train.num_steps=5", "--set", "logging.tensorboard=false",
            "--set", "task.name=bench_lines:make", "--set", f"task.args.print_mb={mb}",
            "--set", f"task.args.line_bytes={line_bytes}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PODLAUNCH_", "XLA_"))}
    env["PYTHONPATH"] = os.pathsep.join([checkout, BENCH])  # the checkout's launcher and worker
    started = time.monotonic()
    done = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{tag}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="294a0e8")
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--line-bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_lines-") as workdir:
        base = os.path.join(workdir, "baseline")
        subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", "-q", base, args.baseline],
                       check=True)
        try:
            sides = {"this": REPO, args.baseline: base}
            walls: dict = {(name, p): [] for name in sides for p in ("print", "none")}
            for r in range(args.rounds):
                names = list(sides) if r % 2 == 0 else list(sides)[::-1]
                for name in names:
                    for what in ("none", "print"):
                        mb = args.mb if what == "print" else 0
                        wall = launch(sides[name], workdir, mb, args.line_bytes, f"{name}-{what}-{r}")
                        walls[(name, what)].append(wall)
                        print(f"round {r} {name:>8} {what:5}: {wall:6.1f} s", flush=True)
        finally:
            subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", base], check=False)
    print(f"\n{args.mb} MiB in {args.line_bytes}-byte lines from process 1 (hidden), 2 x 1, "
          f"{args.rounds} rounds")
    cost = {}
    for name in sides:
        printing = [p - n for p, n in zip(walls[(name, "print")], walls[(name, "none")])]
        cost[name] = printing
        print(f"{name:>8}: print {statistics.median(walls[(name, 'print')]):6.1f} s, none "
              f"{statistics.median(walls[(name, 'none')]):5.1f} s, the printing "
              f"{statistics.median(printing):6.1f} s")
    ratios = [a / b for a, b in zip(cost["this"], cost[args.baseline])]
    print(f"the printing's cost, this / {args.baseline}: {statistics.median(ratios):.2f} "
          f"({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
