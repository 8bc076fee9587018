"""A program job's program that fails on purpose (tests/test_program.py).

    python faulty_program.py MODE PROCESS_ID STEP

MODE: ``crash-before-join`` (process PROCESS_ID raises before initialize),
``exit0`` (exits 0 after reporting STEP), ``kill9`` (SIGKILLs itself at STEP),
``helper`` (starts a child that outlives nothing: it must die with the run).
Every other process trains normally (log_every_steps steps of a tiny pmean).
"""

import os
import signal
import subprocess
import sys
import time

mode, target, at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
me = int(os.environ["PODLAUNCH_PROCESS_ID"])
if mode == "crash-before-join" and me == target:
    raise RuntimeError("no such dataset (on purpose, before joining)")

from worker import program  # noqa: E402

jax = program.initialize()
import jax.numpy as jnp  # noqa: E402

if mode == "helper":  # a process the program starts itself, in its own session
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
step_fn = jax.pmap(lambda x: jax.lax.pmean(x, "i"), axis_name="i")
x = jnp.ones((jax.local_device_count(),))
num_steps = int(os.environ.get("STEPS", "20"))
for step in range(1, num_steps + 1):
    loss = step_fn(x)[0]
    program.report(step, loss=loss)
    if me == target and step == at:
        if mode == "exit0":
            sys.exit(0)
        if mode == "kill9":
            os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
