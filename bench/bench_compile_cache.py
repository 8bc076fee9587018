"""Time from a restart to its first step, with JAX's persistent compilation cache and without.

Each side is one real ``launch`` (single-host debug mode) of a task whose
step takes over a second to compile (``deep_mlp``: an MLP of ``--layers``
dense layers, unrolled, so XLA compiles every layer), with a fault that
fires once: process ``--crash-process-id`` SIGKILLs itself after step
``--crash-at-step`` of attempt 0, and ``restarts.max_restarts: 1`` restarts
every process from the latest checkpoint. The sides differ in one key:
``train.compilation_cache`` true (the default: attempt 1 reads what attempt 0
wrote under ``<run dir>/compilation-cache``) or false.

Measured per side, from the launcher's own output read as it comes:
``restart to first step``, the seconds from the launcher's ``attempt 1
(... restart 1 of 1 in all): starting`` line to process 0's first progress line of that
attempt (``logging.log_every_steps: 1``), and, from every process's log of
attempt 1, its ``compilation cache: H hits, M misses; first step ... S s``
line: what JAX's cache really did, per process (JAX writes entries from
process 0 only, and entries may be rejected on reload; nothing is assumed).

``--rerun``: a re-run instead of a restart. No fault; each side launches
without ``--run-dir`` from a directory of its own, so every run is in the
default layout (``runs/linear/<timestamp>``) and, with the cache, reads
``runs/linear/compilation-cache``, which one untimed run fills before the
rounds. Measured: the seconds from starting ``launch`` to process 0's first
progress line, and every process's cache line of that run (attempt 0).

Rounds alternate the order (ABBA); the ratio is off / on per round, median
(min-max).

    python bench/bench_compile_cache.py --rounds 4
    python bench/bench_compile_cache.py --topology 2x1 --rounds 4
    python bench/bench_compile_cache.py --rerun --rounds 4
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from launcher import logtimes  # noqa: E402  (after the path is set)
from worker import contract  # noqa: E402
from worker.contract import wire  # noqa: E402


def deep_mlp(layers: int = 12, width: int = 32, crash_at_step: int = 0,
             crash_process_id: int = 0):
    """A task (``task.name: bench_compile_cache:deep_mlp``): ``layers`` tanh layers of
    ``width`` units, then a linear output; mean squared error. The layers are a Python
    loop, so the step's HLO grows with ``layers`` and so does its compile time.

    ``crash_at_step`` (0 = never): process ``crash_process_id`` SIGKILLs itself after
    that step on attempt 0 (``PODLAUNCH_ATTEMPT``), a retryable failure.
    """
    import jax
    import jax.numpy as jnp

    from worker import tasks

    def init_params(key, in_features, out_features):
        sizes = [in_features] + [width] * layers + [out_features]
        keys = jax.random.split(key, len(sizes) - 1)
        return [(jax.random.normal(k, (a, b)) / jnp.sqrt(a), jnp.zeros((b,)))
                for k, a, b in zip(keys, sizes[:-1], sizes[1:])]

    def loss_fn(params, x, y):
        for w, b in params[:-1]:
            x = jnp.tanh(x @ w + b)
        w, b = params[-1]
        return jnp.mean((x @ w + b - y) ** 2)

    def on_step_end(step, process_id):
        if (step == crash_at_step and process_id == crash_process_id
                and os.environ.get(contract.ATTEMPT, "0") == "0"):
            print(f"bench_compile_cache: SIGKILL at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return tasks.Task(init_params=init_params, loss_fn=loss_fn, on_step_end=on_step_end)


RESTART = re.compile(r"^podlaunch: attempt 1 \(.*restart 1 of 1 in all\): starting")
STEP = re.compile(r"^\[p0\] step \d+/\d+ loss")
RUN_DIR = re.compile(r"^podlaunch: run directory (\S+)")


def run(cache: bool, args, workdir: str, tag: str) -> dict:
    """One launch with a restart (``--rerun``: a run in ``workdir/tag/runs/linear/``); the
    restart's (the run's) time to its first step and every process's cache line."""
    processes, devices = (int(v) for v in args.topology.split("x"))
    if args.rerun:
        cwd, where = os.path.join(workdir, tag), []
        os.makedirs(cwd, exist_ok=True)
    else:
        cwd, where = REPO, ["--run-dir", os.path.join(workdir, tag)]
    argv = [sys.executable, "-m", "launcher.cli", os.path.join(REPO, "jobs", "linear.yaml"),
            *where, "--status-every", "0",
            "--set", f"cluster.num_processes={processes}",
            "--set", f"cluster.devices_per_process={devices}",
            "--set", "task.name=bench_compile_cache:deep_mlp",
            "--set", f"task.args.layers={args.layers}", "--set", f"task.args.width={args.width}",
            "--set", f"task.args.crash_at_step={0 if args.rerun else 7}",
            "--set", f"task.args.crash_process_id={args.crash_process_id}",
            "--set", "train.num_steps=20", "--set", "logging.log_every_steps=1",
            "--set", "checkpoint.every_steps=5", "--set", "restarts.max_restarts=1",
            "--set", "restarts.backoff_s=0.1", "--set", f"train.compilation_cache={str(cache).lower()}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PODLAUNCH_", "XLA_"))}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "bench"), REPO])
    restart_at = first_at = run_dir = None
    started = time.monotonic()
    with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as launch:
        text = []
        for line in launch.stdout:
            now = time.monotonic()
            text.append(line)
            if run_dir is None and RUN_DIR.match(line):
                run_dir = RUN_DIR.match(line)[1]
            if restart_at is None and (args.rerun or RESTART.match(line)):
                restart_at = started if args.rerun else now
            if restart_at is not None and first_at is None and STEP.match(line):
                first_at = now
        code = launch.wait()
    if code != 0 or restart_at is None or first_at is None or run_dir is None:
        raise SystemExit(f"{tag}: exit {code}, restart seen {restart_at is not None}, "
                         f"first step seen {first_at is not None}:\n{''.join(text)[-4000:]}")
    lines = {}
    for process_id in range(processes):
        log = os.path.join(run_dir, "logs", "" if args.rerun else "attempt-1",
                           f"process-{process_id:03d}.log")
        lines[process_id] = next(m for m in map(wire.CACHE_RE.match,
                                                logtimes.read_text(log).splitlines()) if m)
    return {"restart_s": first_at - restart_at,
            "first_step_s": {p: float(m["seconds"]) for p, m in lines.items()},
            "hits": {p: (int(m["hits"]), int(m["misses"])) for p, m in lines.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="1x2", help="PxD: P processes x D CPU devices")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--crash-process-id", type=int, default=0)
    parser.add_argument("--rerun", action="store_true",
                        help="time a re-run of the job (runs/<job>/ layout) from the command to "
                             "its first step, instead of a restart")
    args = parser.parse_args()
    what = "re-run" if args.rerun else "restart"
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, {args.topology}, deep_mlp "
          f"{args.layers} x {args.width}, {args.rounds} rounds (ABBA), {what}", flush=True)
    sides = [("on", True), ("off", False)]
    got: dict = {name: [] for name, _ in sides}
    with tempfile.TemporaryDirectory() as workdir:
        if args.rerun:  # the job's cache, filled by an earlier run (not timed)
            run(True, args, workdir, "on")
        for index in range(args.rounds):
            for name, cache in (sides if index % 2 == 0 else sides[::-1]):
                result = run(cache, args, workdir, name if args.rerun else f"{name}-{index}")
                got[name].append(result)
                print(f"  round {index} cache {name:<3}: {what} to first step "
                      f"{result['restart_s']:.2f} s; per process (first step s, hits/misses): "
                      + ", ".join(f"p{p} {result['first_step_s'][p]:.2f} s "
                                  f"{result['hits'][p][0]}/{result['hits'][p][1]}"
                                  for p in sorted(result["hits"])), flush=True)
    for name, _ in sides:
        times = [r["restart_s"] for r in got[name]]
        compiles = [max(r["first_step_s"].values()) for r in got[name]]
        print(f"cache {name:<3}: {what} to first step median {statistics.median(times):.2f} s "
              f"({min(times):.2f}-{max(times):.2f}); slowest process's first step median "
              f"{statistics.median(compiles):.2f} s")
    for measure, key in ((f"{what} to first step", lambda r: r["restart_s"]),
                         ("slowest first step", lambda r: max(r["first_step_s"].values()))):
        ratios = [key(off) / key(on) for on, off in zip(got["on"], got["off"])]
        print(f"off / on, {measure}: {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
