"""A controllable test task: the seed's linear regression plus injected faults.

Used as a *user* task (``task.name: faulty_task:make``), so fault tests also
exercise the plug-in path. Faults act on the host after a step completes.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import subprocess
import sys
import time

from worker import tasks


def make(crash_at_step: int = 0, crash_process_id: int = 0, mode: str = "raise",
         sleep_s: float = 0.0, slow_process_id: int = -1, slow_attempt: int = -1,
         helpers: bool = False,
         long_line_mb: int = 100, print_mb: int = 0, print_line_bytes: int = 0) -> tasks.Task:
    """The linear task; at ``crash_at_step`` process ``crash_process_id`` misbehaves.

    Args:
      crash_at_step: completed step after which the fault fires (0 = never).
      crash_process_id: which process misbehaves.
      mode: ``raise`` (RuntimeError), ``exit`` (os._exit(7)), ``exit0`` (os._exit(0): an
        early exit that looks like success), ``sigkill`` (kills
        itself with SIGKILL), ``wipe_sigkill`` (its run directory removed once the local tier's
        writer is done, then SIGKILL: over ssh, a host that dies and comes back empty), ``sigterm`` (itself with SIGTERM: a preemption's notice), ``stall`` (sleeps forever: alive, no progress),
        ``sigstop`` (stops itself), ``emfile`` (opens /dev/null until the open-files limit
        refuses one: OSError EMFILE, as a leak of file handles ends), ``long_line`` (prints ``long_line_mb`` MiB of ``x``
        without a newline, then exits with 7: its last line ends without one).
      sleep_s: seconds every step of ``slow_process_id`` sleeps (a straggler).
      slow_process_id: which process is slow (-1 = none).
      slow_attempt: the attempt (``PODLAUNCH_ATTEMPT``) on which it is slow (-1 = every one):
        a run that must still be running when a test interrupts it, and that may then
        resume at full speed.
      print_mb: after step 1 process 0 prints this many MiB of ``x`` (bench/bench_ssh_long_lines.py),
        as one line (``print_line_bytes`` 0) or in lines of ``print_line_bytes`` bytes, newline included.
      helpers: after step 1 every process starts two ``sleep 1234`` helpers, as data
        loaders and uploaders do: one in its process group, one in a session of its own
        (it left the group), both inheriting the worker's environment.
    """

    def on_step_end(step: int, process_id: int) -> None:
        if print_mb and step == 1 and process_id == 0:
            _print_bytes(print_mb << 20, print_line_bytes)
        if helpers and step == 1:
            subprocess.Popen(["sleep", "1234"])
            subprocess.Popen(["sleep", "1234"], start_new_session=True)
            print("faulty_task: started 2 helpers", flush=True)
        if process_id == slow_process_id and sleep_s and slow_attempt in (
                -1, int(os.environ.get("PODLAUNCH_ATTEMPT", "0"))):
            time.sleep(sleep_s)
        if step != crash_at_step or process_id != crash_process_id:
            return
        print(f"faulty_task: injecting {mode} at step {step}", flush=True)
        if mode == "raise":
            raise RuntimeError(f"injected failure at step {step}")
        if mode == "exit":
            sys.stdout.flush()
            os._exit(7)
        if mode == "exit0":
            sys.stdout.flush()
            os._exit(0)
        if mode == "long_line":
            for _ in range(long_line_mb):
                sys.stdout.write("x" * (1 << 20))
            sys.stdout.flush()
            os._exit(7)
        if mode == "sigterm":  # what a preempted VM's shutdown does to it: a notice
            os.kill(os.getpid(), signal.SIGTERM)
            # the handler raises SystemExit in here (checkpoint.notice_grace_s 0), or
            # hands the notice to the loop, which stops after the step all agree on
            time.sleep(0.2)
        if mode == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "wipe_sigkill":  # the host dies and comes back with an empty run directory
            _wipe_then_die(os.environ["PODLAUNCH_RUN_DIR"])
        if mode == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if mode == "emfile":
            leaked = []
            while True:  # raises OSError(EMFILE) at the limit
                leaked.append(open(os.devnull))
        if mode == "stall":
            while True:
                time.sleep(3600)

    return tasks.Task(init_params=tasks.init_linear, loss_fn=tasks.mse, on_step_end=on_step_end)


def _wipe_then_die(run_dir: str) -> None:
    """A host that dies and comes back empty: ``run_dir`` removed, then SIGKILL, with nothing
    written into the directory in between. The local tier's writer thread (a step behind on
    a loaded machine) is let finish first, found among this process's objects (the task has
    no handle on the loop's): removing the directory while it wrote left a copy it finished
    afterwards, which the restart then found. (A forked child that killed the process and
    removed the directory after could itself be killed by the wrapper, which stops the dead
    worker's process group and descendants, halfway through the removal.)"""
    for tier in [o for o in gc.get_objects() if type(o).__name__ == "LocalTier"]:
        tier.close()
    shutil.rmtree(run_dir, ignore_errors=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _print_bytes(size: int, line_bytes: int) -> None:
    block = ("x" * (line_bytes - 1) + "\n") * max(1, (1 << 20) // line_bytes) if line_bytes else "x" * (1 << 20)
    written = 0
    while written + len(block) <= size:
        sys.stdout.write(block)
        written += len(block)
    sys.stdout.write("x" * max(0, size - written - 1) + "\n")
    sys.stdout.flush()


def first_attempt(fault_attempts: int = 1, **kwargs) -> tasks.Task:
    """``make``, but the fault fires on the first ``fault_attempts`` attempts only (attempt 0
    by default; ``task.name: faulty_task:first_attempt``), so a restarted run can finish."""
    if int(os.environ.get("PODLAUNCH_ATTEMPT", "0")) >= fault_attempts:
        kwargs["crash_at_step"] = 0
    return make(**kwargs)
