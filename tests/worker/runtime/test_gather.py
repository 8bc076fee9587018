"""worker.runtime.gather against JAX's real coordination service.

One process starts the service (``jax.distributed.initialize`` with
num_processes=1) and plays process 0 and the posting processes on the same
client: the key-value store, its overwrite and directory reads are the real
ones; only the process boundary is left out (the 2x2 and ssh runs cross it).
"""

from __future__ import annotations

import json
import subprocess
import sys

from harness.helpers import REPO, env_for_tests
from launcher.proctl import free_port

SCRIPT = r"""
import json, math, sys, time
import jax
jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=1, process_id=0,
                           cluster_detection_method="deactivate")
from worker.runtime.gather import SLOTS, KeyValueGather, coordination_client, decode, encode

client = coordination_client()
p0, p1, p2 = (KeyValueGather(i, 3, client) for i in range(3))
out = {}

p0.post([(5, 0.5), (10, 0.25)])
p1.post([(5, 1.0 / 3.0), (10, 1e-7)])
out["one_missing"] = p0.collect([5, 10])           # p2 has not posted: nothing complete
p2.post([(5, 2.0)])
out["step_5_only"] = p0.collect([5, 10])
p2.post([(10, 3.0)])
out["step_10"] = p0.collect([10])
out["again"] = p0.collect([10])                    # written once, not twice

# Processes that post more batches than there are slots before process 0 reads:
steps = list(range(100, 111))  # 11 batches each, SLOTS (4) kept
for step in steps:
    p0.post([(step, 0.0)])
    p1.post([(step, 1.0)])
    p2.post([(step, 2.0)])
got = p0.collect(steps)
assert SLOTS == 4, SLOTS
out["overwritten"] = {"values": {step: [None if math.isnan(v) else v for v in got[step]]
                                 for step in sorted(got)},
                      "lost_p1_p2": p0.lost_batches}

p0.post([(200, 0.1)])
p1.post([(200, 0.2)])
start = time.monotonic()
waited = p0.wait([200], timeout_s=0.3)
out["wait"] = {"values": [None if math.isnan(v) else v for v in waited[200]],
               "seconds": time.monotonic() - start}
seq, entries = decode(encode(7, [(3, 0.1), (4, float("inf"))]))
out["codec"] = [seq, [[step, repr(value)] for step, value in entries]]
print(json.dumps(out))
jax.distributed.shutdown()
"""


def test_key_value_gather_completes_steps_exactly_once_and_reports_what_it_lost():
    port = free_port("127.0.0.1")
    done = subprocess.run([sys.executable, "-c", SCRIPT, f"127.0.0.1:{port}"], cwd=REPO,
                          env=env_for_tests(JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["one_missing"] == {}
    assert out["step_5_only"] == {"5": [0.5, 1.0 / 3.0, 2.0]}  # floats survive exactly
    assert out["step_10"] == {"10": [0.25, 1e-7, 3.0]}
    assert out["again"] == {}
    # the newest 4 (SLOTS) batches of each process survive; the 7 older ones of p1 and of p2 are
    # lost, and their steps are complete anyway (newer steps came), with NaN (None) for them
    values = out["overwritten"]["values"]
    assert sorted(map(int, values)) == list(range(100, 111))
    for step in range(100, 107):
        assert values[str(step)] == [0.0, None, None], step
    for step in range(107, 111):
        assert values[str(step)] == [0.0, 1.0, 2.0], step
    assert out["overwritten"]["lost_p1_p2"] == 7 + 7
    assert out["wait"]["values"] == [0.1, 0.2, None]  # p2 never posted: NaN after the timeout
    assert 0.3 <= out["wait"]["seconds"] < 5
    assert out["codec"] == [7, [[3, "0.1"], [4, "inf"]]]
