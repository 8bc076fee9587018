"""One process of a job: identity from the environment, join, check, train
(``worker.trainer.loop``), and the line that explains its end.

Order matters: the environment is read and checked before jax is imported
(JAX reads JAX_PLATFORMS / JAX_NUM_CPU_DEVICES when its backends start), and
``jax.distributed.initialize`` must run before anything touches a device: the loop's
module, which imports jax, is imported after the join.
"""

from __future__ import annotations

import os
import sys
import traceback

from worker import contract
from worker.contract import causes, wire
from worker.contract import job as jobs
from worker.data.sources import DataError
from worker.runtime import interrupts
from worker.runtime.joining import join, rendezvous, single_process


def _unusable_checkpoint(exc: BaseException) -> bool:
    """Whether ``exc`` is a checkpoint that cannot be used (corrupt, of another model): its
    text says which and why. (Looked up, not imported: worker.recovery.checkpoint imports numpy.)"""
    checkpoint = sys.modules.get("worker.recovery.checkpoint")
    return checkpoint is not None and isinstance(exc, checkpoint.CheckpointError)


def _traceback_for_the_log() -> None:
    """The traceback of an expected failure (its sentence already said), between the marks
    that keep it in the process's log file only: off the console and the summary."""
    print(wire.DETAIL_BEGIN, flush=True)
    traceback.print_exc(file=sys.stdout)
    print(wire.DETAIL_END, flush=True)


def _exit_now(code: int) -> None:
    """Exit without Python's atexit hooks.

    JAX registers an atexit hook that joins the coordination service's shutdown
    barrier; a failed or terminated worker would wait there for peers that will
    never arrive (up to shutdown_timeout_seconds, 300 s by default).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    """Entry point of ``python -m worker``; exits non-zero on any failure."""
    # the launcher's SIGTERM unwinds the worker as SystemExit, so `finally` blocks write what
    # process 0 holds; a worker stuck in a collective gets SIGKILL later
    interrupts.install()
    interrupts.answer_stack_requests()  # launcher.run.stacks: what a hung run was doing
    identity = None
    try:
        identity = contract.Identity.from_env(os.environ)
        if identity.rendezvous == "stdin":
            identity = rendezvous(identity)
        job = jobs.WorkerJob.from_json(identity.job_path)
        jax = join(identity, job)
        # jax.distributed.initialize (when called) installs its preemption notifier's SIGTERM
        # handler, which swallows the launcher's TERM: the worker then sat out
        # grace_s until SIGKILL, with its TensorBoard writer never closed.
        interrupts.install()
        if single_process(identity):
            print("process 0/1: one process, in-process collectives "
                  "(no jax.distributed)", flush=True)
        else:
            print(wire.Joined(jax.process_index(), jax.process_count(),
                              identity.coordinator_address).text(), flush=True)
        from worker.trainer import loop  # jax, after the join

        loop.train(identity, job, out=lambda text: print(text, flush=True))
    # the last line explains the end where the worker knows its cause (worker.contract.causes): the
    # launcher's class is read from it, never from an exit code a program could also use
    except contract.ContractError as exc:  # Mismatch too: a configuration problem, not retried
        print(causes.line(causes.MISMATCH, str(exc)), flush=True)
        _exit_now(contract.EXIT_MISMATCH)
    except DataError as exc:  # bad rows: the same on a retry, so a code no restart retries
        print(causes.line(causes.DATA, f"data error: {exc}"), flush=True)
        _exit_now(contract.EXIT_DATA)
    except SystemExit as exc:  # SIGTERM from the launcher
        _exit_now(exc.code if isinstance(exc.code, int) else 1)
    except OSError as exc:
        full = causes.disk_full(exc, identity.run_dir if identity is not None else None)
        ran_out = causes.exhausted(exc)
        if full is None and ran_out is None:
            traceback.print_exc()  # kept in the log; the cause comes last, where the summary looks
        else:
            _traceback_for_the_log()
        print(causes.line(causes.DISK_FULL, full) if full else
              causes.line(causes.EXHAUSTED, ran_out) if ran_out else
              f"worker: {type(exc).__name__}: {exc}", flush=True)
        _exit_now(1)
    except BaseException as exc:
        if isinstance(exc, FloatingPointError):  # a non-finite loss: train said "failed at step N"
            _traceback_for_the_log()
        elif _unusable_checkpoint(exc):  # found before the first step: the sentence is ours
            _traceback_for_the_log()
            print(f"worker: {exc}", flush=True)
        else:
            traceback.print_exc()
        _exit_now(1)
    if not single_process(identity):
        jax.distributed.shutdown()
    print(wire.Done().text(), flush=True)
    _without_jax_clean_up()


def _without_jax_clean_up() -> None:
    """End this process without JAX's atexit hook and the interpreter's teardown, keeping
    what a task may rely on: its atexit hooks run and its non-daemon threads are joined.

    Everything of the run is written and closed (``jax.distributed`` shut down); JAX's hook
    would clear every cache and backend one by one, and the interpreter's teardown frees
    every object: 0.2-0.3 s of CPU per process (py-spy; a 2 x 2 launch 4.0 against 3.3
    CPU-s), which the process's end does at once. What this skips is the flush of files a
    task opened and never closed.
    """
    import atexit
    import threading

    from jax._src import api  # where JAX registers it (jax 0.9-0.12)

    hook = getattr(api, "clean_up", None)
    if hook is not None:
        atexit.unregister(hook)
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # the task's, tensorboardX's (its writers are closed), XLA's GC
    _exit_now(0)
