"""A program job's program with its own checkpoints that stops for a preemption notice
(``worker.program.stop_after`` and ``preempted``): tests/worker/test_program.py.

    python notice_program.py PROCESS_ID STEP

Process PROCESS_ID SIGTERMs itself after step STEP of attempt 0 (0: never). Every process
runs STEPS (environment, default 40) steps of ``w <- 0.9 w + pmean(step * ones)``, a state
that depends on every step, in order; at the agreed step process 0 saves ``w`` and the step
to ``checkpoint_dir()/step-NNNNNNN/state.npz``, and a resumed attempt starts after the
newest one. At the end process 0 writes ``final.npy`` into its run directory.
"""

import os
import signal
import sys

import numpy as np

from podlaunch import program

target, at = int(sys.argv[1]), int(sys.argv[2])
jax = program.initialize()
import jax.numpy as jnp  # noqa: E402

me, first_attempt = jax.process_index(), program.attempt() == 0
num_steps = int(os.environ.get("STEPS", "40"))
step_fn = jax.pmap(lambda w, s: 0.9 * w + jax.lax.pmean(s * jnp.ones_like(w), "i"), axis_name="i")
w, start = np.zeros((jax.local_device_count(), 3), np.float32), 1
saved = sorted(os.listdir(program.checkpoint_dir())) if program.resuming() and \
    os.path.isdir(program.checkpoint_dir()) else []
if saved:  # one run directory on this machine: every process reads process 0's checkpoint
    with np.load(os.path.join(program.checkpoint_dir(), saved[-1], "state.npz")) as f:
        w, start = np.broadcast_to(f["w"], w.shape).copy(), int(f["step"]) + 1
    print(f"notice_program: resumed after step {start - 1}", flush=True)
    program.resumed_from(start - 1)
for step in range(start, num_steps + 1):
    w = step_fn(w, jnp.full((jax.local_device_count(),), float(step)))
    program.report(step, loss=w[0, 0])
    if first_attempt and me == target and step == at:
        print(f"notice_program: SIGTERM at step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
    if program.stop_after(step):
        if me == 0:
            path = os.path.join(program.checkpoint_dir(), f"step-{step:07d}")
            os.makedirs(path, exist_ok=True)
            np.savez(os.path.join(path, "state.npz"), w=np.asarray(w[0]), step=step)
            print(f"notice_program: saved step {step}", flush=True)
        program.preempted()
if me == 0:
    np.save(os.path.join(program.run_dir(), "final.npy"), np.asarray(w[0]))
