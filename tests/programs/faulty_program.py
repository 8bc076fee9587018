"""A program job's program that fails on purpose (tests/worker/test_program.py, and the trainer's
fault tests parametrized over both kinds of job: helpers.program_job).

    python faulty_program.py MODE PROCESS_ID STEP

MODE: one or more of these joined by ``+``: ``none`` (no fault), ``crash-before-join`` (process PROCESS_ID raises before
initialize), ``exit0-before-join`` (process PROCESS_ID exits 0 before initialize), ``never-join`` (process PROCESS_ID sleeps instead of calling initialize:
its peers wait in it), ``exit0`` (exits 0 after reporting STEP), ``kill9`` (SIGKILLs
itself at STEP), ``sigstop`` (SIGSTOPs itself at STEP), ``raise`` (an uncaught
RuntimeError at STEP), ``busy`` (every other process spends its steps from STEP on in
host code, 2 s each, as a process busy with its input or a logger would: it is not in a
collective when the faulty one ends), ``helpers`` (after step 1 every
process starts two ``sleep 1234`` helpers, one in its process group, one in a session of
its own: they must die with the run), ``init-twice`` (every process calls initialize a second
time: a library and the program both do), ``own-stdout`` (after initialize every process
points ``sys.stdout``, and descriptor 1, at a file of its own in its working directory,
``own-stdout-N.txt``, as a program that keeps its own log does). Faults fire on attempt 0 only
(``PODLAUNCH_ATTEMPT``), so a restarted run can finish. Every process trains STEPS
(environment, default 20) steps of a tiny pmean, 0.05 s apart.
"""

import os
import signal
import subprocess
import sys
import time

modes, target, at = set(sys.argv[1].split("+")), int(sys.argv[2]), int(sys.argv[3])
me = int(os.environ["PODLAUNCH_PROCESS_ID"])
attempt, resume = os.environ.get("PODLAUNCH_ATTEMPT", "0"), os.environ.get("PODLAUNCH_RESUME")
print(f"faulty_program: attempt {attempt}, PODLAUNCH_RESUME={resume}", flush=True)
if attempt != "0":
    modes = {"none"}
faulty = me == target
if "crash-before-join" in modes and faulty:
    raise RuntimeError("no such dataset (on purpose, before joining)")
if "exit0-before-join" in modes and faulty:
    print("faulty_program: leaving before joining (on purpose)", flush=True)
    sys.exit(0)
if "never-join" in modes and faulty:
    print("faulty_program: not joining (on purpose)", flush=True)
    time.sleep(3600)

from worker import program  # noqa: E402

jax = program.initialize()
if "init-twice" in modes:
    assert program.initialize() is jax
if "own-stdout" in modes:
    sys.stdout = open(f"own-stdout-{me}.txt", "w", buffering=1)
    os.dup2(sys.stdout.fileno(), 1)
    print(f"faulty_program: process {me} prints here", flush=True)
import jax.numpy as jnp  # noqa: E402

step_fn = jax.pmap(lambda x: jax.lax.pmean(x, "i"), axis_name="i")
x = jnp.ones((jax.local_device_count(),))
num_steps = int(os.environ.get("STEPS", "20"))
for step in range(1, num_steps + 1):
    loss = step_fn(x)[0]
    program.report(step, loss=loss)
    if "helpers" in modes and step == 1:
        subprocess.Popen(["sleep", "1234"])
        subprocess.Popen(["sleep", "1234"], start_new_session=True)
        print("faulty_program: started 2 helpers", flush=True)
    fault = modes & {"exit0", "kill9", "sigstop", "raise"}
    if faulty and step == at and fault:
        mode = fault.pop()
        print(f"faulty_program: injecting {mode} at step {step}", flush=True)
        if mode == "exit0":
            sys.exit(0)
        if mode == "kill9":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if mode == "raise":
            raise RuntimeError(f"injected failure at step {step}")
    time.sleep(2.0 if "busy" in modes and not faulty and step >= at else 0.05)
