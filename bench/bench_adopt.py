"""How long ``launch attach`` takes to take back a detached local run whose supervisor was
SIGKILLed, and ``launch stop`` of the run it took back.

Each round: ``launch jobs/linear.yaml --detach`` (2 processes x 2 CPU devices, process 0
sleeping 50 ms a step, tests/programs/faulty_task.py), its supervisor SIGKILLed once
process 0 logged step 40, ``--gap`` seconds of nobody watching, then ``launch attach``:
printed, the seconds from the attach's start to the new supervisor's ``taken back`` line in
launcher.log and to its journal naming the processes again, the ledger's ``unsupervised``
seconds, and how long ``launch stop`` of the run then takes (every process gone).

    python bench/bench_adopt.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = [sys.executable, "-m", "launcher.cli"]
ENV = dict(os.environ, PYTHONPATH=os.path.join(REPO, "tests", "programs"))


def _until(done, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while not (value := done()):
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.01)
    return value


def _read(path: str) -> str:
    """The file's text ("" until it is there)."""
    return open(path, errors="replace").read() if os.path.exists(path) else ""


def one_round(run_dir: str, gap_s: float) -> dict:
    started = subprocess.run(LAUNCH + [
        "jobs/linear.yaml", "--set", "train.num_steps=100000", "--set", "logging.log_every_steps=20",
        "--set", "task.name=faulty_task:make", "--set", "task.args.sleep_s=0.05",
        "--set", "task.args.slow_process_id=0", "--run-dir", run_dir, "--detach"],
        cwd=REPO, env=ENV, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert started.returncode == 0, started.stderr
    killed = json.loads(_read(f"{run_dir}/run.json"))["launcher"]["pid"]
    _until(lambda: "step 40/" in _read(f"{run_dir}/logs/process-000.log"))
    os.kill(killed, signal.SIGKILL)
    time.sleep(gap_s)
    began = time.monotonic()
    attach = subprocess.Popen(LAUNCH + ["attach", run_dir], cwd=REPO, env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _until(lambda: "taken back" in _read(f"{run_dir}/launcher.log"))
    taken = time.monotonic() - began

    def journal_again() -> bool:
        try:
            kept = json.loads(_read(f"{run_dir}/supervisor.json"))
            record = json.loads(_read(f"{run_dir}/run.json"))
        except ValueError:
            return False
        return bool(kept.get("workers")) and record["launcher"]["pid"] != killed
    _until(journal_again)
    journaled = time.monotonic() - began
    stop_began = time.monotonic()
    stopped = subprocess.run(LAUNCH + ["stop", run_dir], cwd=REPO, env=ENV, capture_output=True)
    stop_s = time.monotonic() - stop_began
    attach.wait(60)
    ledger = json.loads(_read(f"{run_dir}/ledger.json"))
    return {"taken_back_s": round(taken, 2), "journal_s": round(journaled, 2),
            "unsupervised_s": ledger["run"]["buckets_s"]["unsupervised"],
            "stop_s": round(stop_s, 2), "stop_exit": stopped.returncode,
            "attach_exit": attach.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gap", type=float, default=3.0, help="seconds nobody watches")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        for i in range(args.rounds):
            print(one_round(os.path.join(root, f"r{i}"), args.gap), flush=True)


if __name__ == "__main__":
    main()
