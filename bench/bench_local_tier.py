"""Steps/s with the local tier at its default (a copy every 100 steps), against it off.

"on":  checkpoint.local_every_steps at its default (every process copies its state off the
       devices every 100 steps, on the step's path, and writes it on a thread into
       <run dir>/local-checkpoints: worker/recovery/localtier.py).
"off": checkpoint.local_every_steps=0.
Both sides keep process 0's checkpoints at their default (every 1,000 steps) and log as
jobs/linear.yaml does. Each side is a real ``launch`` of jobs/linear.yaml (2 processes x 1
CPU device by default), run back to back in ABBA order per round (as bench/bench_logging.py,
whose ``run_once`` shape table and reporting it shares); steps/s from process 0's progress
lines, compilation excluded. The ratio is on / off (1.0 = the local tier is free).

    python bench/bench_local_tier.py                   # seed shape and 65,536 x 256
    python bench/bench_local_tier.py --rounds 5 --shapes seed
"""

from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import bench_logging  # noqa: E402  (after the path is set)

SIDES = {"off": ["--set", "checkpoint.local_every_steps=0"],
         "on": [a for a in os.environ.get("LOCAL_TIER_ON", "").split(" ") if a]}

if __name__ == "__main__":
    bench_logging.SIDES = SIDES
    bench_logging.__doc__ = __doc__
    bench_logging.main()
