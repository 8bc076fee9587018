"""One process of a job: identity from the environment, join, check, train.

Order matters: the environment is read and checked before jax is imported
(JAX reads JAX_PLATFORMS / JAX_NUM_CPU_DEVICES when its backends start), and
``jax.distributed.initialize`` must run before anything touches a device.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
import traceback

from worker import contract
from worker.contract import causes
from worker.contract import job as jobs
from worker.contract.metrics import STEP_METRICS
from worker.data.sources import DataError
from worker.recovery import recovery
from worker.runtime import interrupts
from worker.runtime.compilecache import CompilationCache
from worker.runtime.joining import client_of, join, rendezvous, single_process
from worker.telemetry.profiler import Profiler


def train(identity: contract.Identity, job: jobs.WorkerJob, out=print) -> dict:
    """Run the job's training loop on this process; process 0 logs and saves.

    Returns:
      Final params as a dict of numpy arrays (keyed by pytree path).
    """
    import jax
    import numpy as np

    from worker.data import batches as datasets
    from worker.telemetry import metrics
    from worker.telemetry.tracker import make_tracker
    from worker.trainer import actions as steps
    from worker.trainer import calls, parallelism
    from worker.trainer import tasks
    from worker.trainer.calls import InFlight
    from worker.trainer.train import make_optimizer

    process_id = identity.process_id
    run_dir = identity.run_dir
    num_steps, global_batch = job.train.num_steps, job.train.global_batch_size

    cache = CompilationCache(identity.compilation_cache_dir, run_dir, job.train.compilation_cache)
    source = datasets.open_source(job.data, run_dir)
    order = datasets.make_order(job.data, source.num_rows, global_batch)
    order_key = {"shuffle": job.data.shuffle, "shuffle_seed": job.data.shuffle_seed}
    task = tasks.resolve(job.task.name, job.task.args)
    if task.num_classes is not None and hasattr(source, "num_classes"):  # a table's labels
        source.num_classes = task.num_classes
    local_devices = jax.local_device_count()
    batches = datasets.Batches(source, order, process_id, identity.num_processes, local_devices,
                               place=None, prefetch=job.data.prefetch)
    sample = batches.host_batch(0)  # shapes and dtypes (and an early check of the first rows)
    batches.close()
    weights = sample.pop(datasets.WEIGHT, None)  # padded rows: devices that do not divide the batch
    y = sample.get("y")
    out_features = y.shape[-1] if y is not None and y.ndim == 3 else 1
    optimizer = make_optimizer(job.optimizer)

    def initial_state():
        params = task.init_params(jax.random.PRNGKey(job.train.seed), sample["x"].shape[-1]
                                  if "x" in sample else 0, out_features)
        return params, optimizer.init(params)

    (params, opt_state), first_step = recovery.resume(identity, job, initial_state,
                                                      order.num_batches, out, order_key)
    k = calls.steps_per_call(job.train.steps_per_call, jax.devices()[0].platform, num_steps,
                             first_step - 1, job.checkpoint.every_steps,
                             calls.step_bytes(sample, params))
    every = calls.metrics_every(k, job.logging.log_every_steps)
    parallel = parallelism.of(job.train.parallelism, k, identity.num_processes,
                              identity.local_device_count)
    if (first_step - 1) % k:
        raise ValueError(f"the checkpoint is at step {first_step - 1}, not a multiple of "
                         f"train.steps_per_call {k}; resume with the steps_per_call that saved it")
    params, opt_state = parallel.replicate(params), parallel.replicate(opt_state)
    metric_names = STEP_METRICS
    if task.metrics_fn is not None:
        metric_names += tuple(jax.eval_shape(task.metrics_fn, parallel.unreplicate(params),
                                             {n: a[0] for n, a in sample.items()}))
    step_fn = parallel.make_train_step(task.batch_loss(), optimizer, with_metrics=True,
                                       steps_per_call=k, allreduce=job.train.allreduce,
                                       metrics_fn=task.metrics_fn, metrics_every=every)
    batches = datasets.Batches(source, order, process_id, identity.num_processes, local_devices,
                               parallel.placer(k), steps_per_call=k, prefetch=job.data.prefetch,
                               first_step=first_step - 1, num_steps=num_steps,
                               resident=job.data.resident)
    count = order.num_batches
    fields = ", ".join(f"{list(a.shape)} {n}" + ("" if a.dtype == np.float32 else f" {a.dtype}")
                       for n, a in sample.items())
    devices = f"{local_devices} {jax.devices()[0].platform} device" + (
        "" if local_devices == 1 else "s")
    out(f"process {process_id}: {count} batch{'' if count == 1 else 'es'} of {fields} on "
        f"{devices}" + (f", {k} steps per call" if k > 1 else "")
        + (f", shuffled (seed {order.seed})" if order.shuffle else "")
        + (", resident" if batches.resident else f", prefetch {job.data.prefetch}")
        + (f", {parallel.description}" if parallel.description else "")
        + ("" if weights is None else
           f"; {global_batch} rows over {jax.device_count()} devices: "
           f"{batches.per_device_batch_size} per device with "
           f"{batches.per_device_batch_size * jax.device_count() - global_batch} padding rows of "
           "weight 0, the step a mean weighted over the global batch"))

    tracker = make_tracker(run_dir, process_id, job.logging.tensorboard)
    step, logger, notice, local = 0, None, None, None
    profiler = Profiler(run_dir, process_id, identity.num_processes, job.profile, client_of(identity),
                        out, num_steps)
    try:
        in_flight = InFlight(*calls.in_flight(jax.devices()[0].platform),
                             finished_step=first_step - 1)
        logger = metrics.StepLogger(job, process_id, identity.num_processes, tracker, out,
                                    finished_step=lambda: in_flight.finished_step,
                                    steps_per_call=k, metric_names=metric_names,
                                    metrics_every=every)

        def dispatch(*args):
            outputs = step_fn(*args)
            # ``step``: the loop's, the call's last; waiting on the devices is JAX time, not
            # the host's own
            in_flight.add(outputs[2], step)
            return outputs

        timed_step = logger.timed(dispatch)
        checkpoints = recovery.Recovery(identity, job, order.num_batches, out, parallel.unreplicate,
                                        order_key)
        local = recovery.local_tier(identity, job, order.num_batches, order_key,
                                    parallel.unreplicate, out, first_step - 1)
        notice = recovery.notice(identity, job, out)
        loop = [steps.Profile(profiler, logger.wait), steps.CacheLine(cache, logger, out),
                steps.Log(logger), steps.Save(checkpoints, logger)]
        loop += [steps.LocalCopy(local, num_steps)] if local is not None else []
        loop += [steps.Hook(task.on_step_end, logger, process_id)] if task.on_step_end else []
        before = [action for action in loop if hasattr(action, "before")]
        stopped = False
        # Everything made so far lives as long as the loop: kept out of the garbage
        # collector's full passes, which otherwise stop the loop for up to 0.17 s at a time
        # (the 256 x 4 job at 100 steps a call on CPU: 219-227k steps/s, 250-257k frozen)
        gc.freeze()
        with interrupts.notices(notice.signalled if notice is not None else None):
            # ``step``: the last step of each call (k steps; log, checkpoint and last steps
            # are multiples of k, so they are call boundaries)
            for step in range(first_step + k - 1, num_steps + 1, k):
                if notice is not None and not notice.may_dispatch(step):
                    if notice.stop_step is None:  # no agreement (a peer gone): stop at once,
                        out(notice.line())        # waiting on no device (finally: as before)
                        raise SystemExit(interrupts.exit_code(signal.SIGTERM))
                    stopped = True  # every process stops after the agreed step
                    break
                for action in before:
                    action.before(step - k + 1, step)
                inputs = batches.get(step - k)  # the call's batches, from its first step (0-based)
                with profiler.annotate(step):
                    params, opt_state, loss, step_metrics = timed_step(params, opt_state, *inputs)
                call = steps.Call(step - k + 1, step, params, opt_state, loss, step_metrics)
                for action in loop:  # worker.trainer.actions: the contract each keeps
                    action.after(call)
            logger.finish()  # the only device sync for logging: the last log steps, after the loop
            if stopped:  # a SIGTERM now (the launcher's, seeing a peer end) cuts no save short
                checkpoints.after_notice(notice, step - k, params, opt_state)
                notice.leave()
                raise SystemExit(interrupts.exit_code(signal.SIGTERM))
        final = {jax.tree_util.keystr(path): leaf for path, leaf in
                 jax.tree_util.tree_flatten_with_path(parallel.unreplicate(params))[0]}
        if process_id == 0:
            np.savez(os.path.join(run_dir, "params.npz"), **final)
        if local is not None:  # the run is done: nothing left to restart from
            from worker.recovery import localtier

            local.close()
            localtier.remove_all(os.path.dirname(local.path))
        return final
    except BaseException as exc:
        if not isinstance(exc, SystemExit):
            failed_at = getattr(exc, "step", step)  # a non-finite loss names its (earlier) step
            out(contract.FAILED_TIME_FORMAT.format(at=time.time()))
            out(contract.FAILED_FORMAT.format(step=failed_at, error=f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        profiler.close()
        if notice is not None:
            notice.close()
        if local is not None:
            local.close()  # a copy being written: the restart may need it
        with interrupts.held():  # a SIGTERM now must not cut the writing of the records short
            batches.close()
            if logger is not None:
                logger.close()  # records held for other processes' values: written with what came
            tracker.close()


def _unusable_checkpoint(exc: BaseException) -> bool:
    """Whether ``exc`` is a checkpoint that cannot be used (corrupt, of another model): its
    text says which and why. (Looked up, not imported: worker.recovery.checkpoint imports numpy.)"""
    checkpoint = sys.modules.get("worker.recovery.checkpoint")
    return checkpoint is not None and isinstance(exc, checkpoint.CheckpointError)


def _traceback_for_the_log() -> None:
    """The traceback of an expected failure (its sentence already said), between the marks
    that keep it in the process's log file only: off the console and the summary."""
    print(contract.DETAIL_BEGIN, flush=True)
    traceback.print_exc(file=sys.stdout)
    print(contract.DETAIL_END, flush=True)


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
            print(f"process {jax.process_index()}/{jax.process_count()} joined "
                  f"{identity.coordinator_address}", flush=True)
        train(identity, job, out=lambda text: print(text, flush=True))
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
        said = causes.disk_full(exc, identity.run_dir if identity is not None else None)
        if said is None:
            traceback.print_exc()  # kept in the log; the cause comes last, where the summary looks
        else:
            _traceback_for_the_log()
        print(causes.line(causes.DISK_FULL, said) if said else
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
    print(contract.DONE_LINE, flush=True)
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
