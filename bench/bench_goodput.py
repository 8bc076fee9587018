"""Goodput of one job, clean and with faults, from ``launch`` as users run it.

Each side is one real ``launch`` of ``jobs/linear.yaml`` in single-host debug mode
(``--topology``, default 2 x 2), ``--steps`` steps, a checkpoint every
``--checkpoint-every`` steps, every other setting at its default (the restart budgets
included). The sides differ in the task only:

* ``clean``: the seed's linear task (``bench_goodput:faults`` with no fault);
* ``faults``: the same task with two faults, each on one attempt: process 1 SIGKILLs
  itself after step ``--kill-at`` of attempt 0 (an infrastructure fault), then process 0
  SIGTERMs itself after step ``--term-at`` of attempt 1 (a preemption's notice).

Measured per side: the launch's wall seconds from outside (start to exit), and its
``ledger.json`` (``launcher.rundir.ledger``): the run's goodput, its buckets, the steps
trained again; and per round, whether the two sides' final params (``params.npz``) are
equal within rtol 1e-6. Checked: the ledger's wall time is within 1% of what the launch took
(less its interpreter start) and its buckets add up. Rounds alternate the order (ABBA);
ratios per round, median (min-max).

    python bench/bench_goodput.py --rounds 2
    python bench/bench_goodput.py --steps 6000 --checkpoint-every 1000 --kill-at 2500 --term-at 4700
    python bench/bench_goodput.py --steps 6000 --checkpoint-every 1000 --kill-at 2500 --term-at 4700 \\
        --examples 65536 --features 192   # steps of about 10 ms, as the goodput issue measured

``--examples`` and ``--features`` size the step (``data.num_examples``, the global batch,
``data.in_features``); the defaults are the job's own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from launcher.rundir import ledger  # noqa: E402
from worker import contract  # noqa: E402


def faults(kill_at: int = 0, term_at: int = 0):
    """The seed's linear task (``task.name: bench_goodput:faults``); process 1 SIGKILLs itself
    after step ``kill_at`` of attempt 0, process 0 SIGTERMs itself after step ``term_at`` of
    attempt 1 (0: never)."""
    from worker import tasks

    attempt = int(os.environ.get(contract.ATTEMPT, "0"))

    def on_step_end(step: int, process_id: int) -> None:
        if attempt == 0 and step == kill_at and process_id == 1:
            print(f"bench_goodput: SIGKILL at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if attempt == 1 and step == term_at and process_id == 0:
            print(f"bench_goodput: SIGTERM at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)  # a notice: the loop stops at the agreed step
            time.sleep(0.2)

    return tasks.Task(init_params=tasks.init_linear, loss_fn=tasks.mse, on_step_end=on_step_end)


def run(side: str, args, workdir: str, tag: str) -> dict:
    processes, devices = (int(v) for v in args.topology.split("x"))
    run_dir = os.path.join(workdir, tag)
    kill_at, term_at = (args.kill_at, args.term_at) if side == "faults" else (0, 0)
    argv = [sys.executable, "-m", "launcher.cli", os.path.join(REPO, "jobs", "linear.yaml"),
            "--run-dir", run_dir, "--status-every", "0",
            "--set", f"cluster.num_processes={processes}",
            "--set", f"cluster.devices_per_process={devices}",
            "--set", f"train.num_steps={args.steps}", "--set", "logging.log_every_steps=50",
            "--set", f"checkpoint.every_steps={args.checkpoint_every}",
            "--set", "task.name=bench_goodput:faults",
            "--set", f"data.num_examples={args.examples}",
            "--set", f"train.global_batch_size={args.examples}",
            "--set", f"data.in_features={args.features}",
            "--set", f"task.args.kill_at={kill_at}", "--set", f"task.args.term_at={term_at}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PODLAUNCH_", "XLA_"))}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "bench"), REPO])
    started = time.monotonic()
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"{tag}: exit {result.returncode}:\n{result.stdout[-4000:]}{result.stderr}")
    with open(os.path.join(run_dir, ledger.LEDGER_FILE)) as f:
        data = json.load(f)
    run_ledger = data["run"]
    assert abs(sum(run_ledger["buckets_s"].values()) - run_ledger["wall_s"]) < 0.01, run_ledger
    with np.load(os.path.join(run_dir, "params.npz")) as final:
        params = {name: final[name] for name in final.files}
    return {"wall_s": wall, "ledger": run_ledger, "attempts": len(data["attempts"]), "params": params}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="2x2", help="PROCESSESxDEVICES (default 2x2)")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--checkpoint-every", type=int, default=500)
    parser.add_argument("--kill-at", type=int, default=1250)
    parser.add_argument("--term-at", type=int, default=2350)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--examples", type=int, default=256,
                        help="data.num_examples and train.global_batch_size (the job's 256 by "
                        "default): with --features, the step's size")
    parser.add_argument("--features", type=int, default=4,
                        help="data.in_features (the job's 4 by default); the goodput issue "
                        "measured steps of about 10 ms, which --examples 65536 --features 192 "
                        "gives on a 2-core machine where the job's own steps take 4 ms")
    args = parser.parse_args()
    results = {"clean": [], "faults": []}
    with tempfile.TemporaryDirectory(prefix="bench_goodput-") as workdir:
        for r in range(args.rounds):
            order = ("clean", "faults") if r % 2 == 0 else ("faults", "clean")
            for side in order:
                got = run(side, args, workdir, f"{side}-{r}")
                results[side].append(got)
                lg = got["ledger"]
                print(f"round {r} {side:6}: launch {got['wall_s']:6.1f} s, ledger {lg['wall_s']:6.1f} s "
                      f"({got['attempts']} attempts), goodput {lg['goodput']:.3f}, steps trained "
                      f"again {lg['steps_again']}", flush=True)
    step_ms = [1000 * g["ledger"]["buckets_s"]["productive"] / args.steps for g in results["clean"]]
    print(f"\n{args.topology}, {args.steps} steps of {args.examples} x {args.features} "
          f"({statistics.median(step_ms):.1f} ms each on the clean side), "
          f"checkpoint every {args.checkpoint_every}; "
          f"faults: SIGKILL p1 at step {args.kill_at} (attempt 0), SIGTERM p0 at step "
          f"{args.term_at} (attempt 1); {args.rounds} rounds")
    for side in ("clean", "faults"):
        lg = [g["ledger"] for g in results[side]]
        print(f"{side:6}: goodput median {statistics.median(x['goodput'] for x in lg):.3f}; "
              "buckets (median s): " + ", ".join(
                  f"{name} {statistics.median(x['buckets_s'][name] for x in lg):.2f}"
                  for name in ledger.BUCKETS))
        cover = [g["ledger"]["wall_s"] / g["wall_s"] for g in results[side]]
        print(f"        ledger wall / launch wall: {statistics.median(cover):.3f} "
              f"({min(cover):.3f}-{max(cover):.3f}; the rest: the launcher's interpreter start and "
              "imports, and its summary after the ledger is written)")
    for r, (c, f) in enumerate(zip(results["clean"], results["faults"])):
        diff = max(float(np.max(np.abs(f["params"][n] - c["params"][n]))) for n in c["params"])
        same = all(np.allclose(f["params"][n], c["params"][n], rtol=1e-6, atol=0) for n in c["params"])
        print(f"round {r}: final params faults vs clean: {'equal' if same else 'DIFFERENT'} within "
              f"rtol 1e-6 (max |difference| {diff:.3g})")
    ratios = [f["wall_s"] / c["wall_s"] for c, f in zip(results["clean"], results["faults"])]
    print(f"wall faults / clean: {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
    cost = [(f["wall_s"] - c["wall_s"]) / 2 for c, f in zip(results["clean"], results["faults"])]
    print(f"seconds lost per fault: {statistics.median(cost):.1f} ({min(cost):.1f}-{max(cost):.1f})")


if __name__ == "__main__":
    main()
