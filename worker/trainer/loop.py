# long: one process's loop whole: where it starts from, its actors, and its two paths of calls (the quiet calls' is the loop's own path, kept beside it)
"""One process's training: what the loop starts from (``begin``), the actors it runs with
(``Loop.arm``), then one pass per device call through the step actions
(``worker.trainer.actions``, ``Loop.run``).

``worker.trainer.main`` calls ``train`` once the process has joined the job: this module
imports jax at its top, which nothing before the join may do.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import time
from typing import Any

import jax
import numpy as np

from worker import contract, tasks
from worker.contract import job as jobs, periods, signals, wire
from worker.contract.metrics import STEP_METRICS
from worker.data import batches as datasets, sources
from worker.data.order import WEIGHT
from worker.recovery import recovery
from worker.runtime import interrupts
from worker.runtime.compilecache import CompilationCache
from worker.runtime.joining import client_of
from worker.telemetry import metrics
from worker.telemetry.profiler import Profiler
from worker.telemetry.tracker import make_tracker
from worker.trainer import actions as steps
from worker.trainer import calls, parallelism
from worker.trainer.calls import InFlight
from worker.trainer.train import make_optimizer

QUIET_CHECK_CALLS = 16  # quiet calls between two looks at the clock (the end of QUIET_S)


def train(identity: contract.Identity, job: jobs.WorkerJob, out=print) -> dict:
    """Run the job's training loop on this process; process 0 logs and saves.

    Returns:
      Final params as a dict of numpy arrays (keyed by pytree path).
    """
    loop = Loop(identity, job, begin(identity, job, out), out)
    try:
        loop.arm()
        return loop.finish(loop.run())
    except BaseException as exc:
        if not isinstance(exc, SystemExit):
            failed_at = getattr(exc, "step", loop.step)  # a non-finite loss names its (earlier) step
            out(wire.FailedAt(time.time()).text())
            out(wire.Failed(failed_at, f"{type(exc).__name__}: {exc}").text())
        raise
    finally:
        loop.close()


@dataclasses.dataclass
class Start:
    """What the loop starts from, made once before its first call (``begin``).

    Attributes:
      first_step: the first step this attempt trains (1, or a checkpoint's step + 1).
      steps_per_call: k, the steps of one device call (``worker.trainer.calls``).
      metrics_every: how often a call's steps give a metrics row.
      state: the leaves of ``(params, opt_state)``, replicated as ``parallel`` lays them out.
      calls: the step's device calls over ``state`` (``worker.trainer.calls.StepCalls``).
      batches: each call's inputs (``worker.data.batches.Batches``).
      metric_names: the step's metrics columns, a task's own after ``STEP_METRICS``.
    """

    cache: CompilationCache
    task: Any
    order: Any
    order_key: dict
    first_step: int
    steps_per_call: int
    metrics_every: int
    parallel: Any
    state: list
    calls: Any
    batches: Any
    metric_names: tuple


def begin(identity: contract.Identity, job: jobs.WorkerJob, out) -> Start:
    """Open the data, resolve the task, restore or initialise the state, choose the steps per
    call and the parallelism, and say what this process trains on (one line)."""
    num_steps, global_batch = job.train.num_steps, job.train.global_batch_size
    cache = CompilationCache(identity.compilation_cache_dir, identity.run_dir,
                             job.train.compilation_cache)
    source = sources.open_source(job.data, identity.run_dir)
    order = datasets.make_order(job.data, source.num_rows, global_batch)
    order_key = {"shuffle": job.data.shuffle, "shuffle_seed": job.data.shuffle_seed}
    task = tasks.resolve(job.task.name, job.task.args)
    if task.num_classes is not None and hasattr(source, "num_classes"):  # a table's labels
        source.num_classes = task.num_classes
    local_devices = jax.local_device_count()
    batches = datasets.Batches(source, order, identity.process_id, identity.num_processes,
                               local_devices, place=None, prefetch=job.data.prefetch)
    sample = batches.host_batch(0)  # shapes and dtypes (and an early check of the first rows)
    batches.close()
    weights = sample.pop(WEIGHT, None)  # padded rows: devices that do not divide the batch
    y = sample.get("y")
    out_features = y.shape[-1] if y is not None and y.ndim == 3 else 1
    optimizer = make_optimizer(job.optimizer)

    def initial_state():
        params = task.init_params(jax.random.PRNGKey(job.train.seed), sample["x"].shape[-1]
                                  if "x" in sample else 0, out_features)
        return params, optimizer.init(params)

    (params, opt_state), first_step = recovery.resume(identity, job, initial_state,
                                                      order.num_batches, out, order_key)
    if first_step - 1 > num_steps:  # the launcher refuses it where it sees the checkpoints
        raise contract.ContractError(
            f"the checkpoint is at step {first_step - 1}, past train.num_steps {num_steps}: "
            f"nothing is left to train; resume with train.num_steps above {first_step - 1}, "
            "or start a new run")
    # the calls end where the settings' periods ask (the last step, the saves), rows of
    # metrics fall where they ask (the log steps): worker.contract.periods
    k = calls.steps_per_call(job.train.steps_per_call, jax.devices()[0].platform,
                             [first_step - 1, *periods.steps(job, periods.ENDS_A_CALL)],
                             calls.step_bytes(sample, params))
    every = calls.metrics_every(k, *periods.steps(job, periods.A_ROW))
    platform = jax.devices()[0].platform
    # the run's one batch, resident: a constant of the calls' program (calls.constant_batch)
    constant = job.train.parallelism != "pmap" and calls.constant_batch(
        platform, identity.num_processes, local_devices,
        datasets.is_resident(order, job.data.resident, job.data.prefetch, k), order.num_batches,
        sum(int(a.nbytes) for a in sample.values()))
    parallel = parallelism.of(job.train.parallelism, k, identity.num_processes,
                              identity.local_device_count, constant)
    if (first_step - 1) % k:
        raise ValueError(f"the checkpoint is at step {first_step - 1}, not a multiple of "
                         f"train.steps_per_call {k}; resume with the steps_per_call that saved it")
    state_bytes = sum(int(np.asarray(leaf).nbytes)
                      for leaf in jax.tree_util.tree_leaves((params, opt_state)))
    params, opt_state = parallel.replicate(params), parallel.replicate(opt_state)
    metric_names = STEP_METRICS
    if task.metrics_fn is not None:
        metric_names += tuple(jax.eval_shape(task.metrics_fn, parallel.unreplicate(params),
                                             {n: a[0] for n, a in sample.items()}))
    batches = datasets.Batches(source, order, identity.process_id, identity.num_processes,
                               local_devices, parallel.placer(k), steps_per_call=k,
                               prefetch=job.data.prefetch, first_step=first_step - 1,
                               num_steps=num_steps, resident=job.data.resident)
    baked = {"constants": batches.get(first_step - 1)} if constant and batches.resident else {}
    step_calls = parallel.make_train_step(task.batch_loss(), optimizer, (params, opt_state),
                                          steps_per_call=k, allreduce=job.train.allreduce,
                                          metrics_fn=task.metrics_fn, metrics_every=every,
                                          unroll=calls.unroll(k),
                                          donate=calls.donate(platform, state_bytes, k), **baked)
    start = Start(cache, task, order, order_key, first_step, k, every, parallel,
                  step_calls.flatten(params, opt_state), step_calls, batches, metric_names)
    out(_start_line(identity.process_id, job, start, sample, weights))
    return start


def _start_line(process_id: int, job: jobs.WorkerJob, start: Start, sample: dict, weights) -> str:
    """``process 0: 8 batches of [24, 4] x, [24, 1] y on 2 cpu devices, prefetch 2``: what
    this process trains on, how, and the padding rows when the devices do not divide the
    global batch."""
    count, k, batches = start.order.num_batches, start.steps_per_call, start.batches
    fields = ", ".join(f"{list(a.shape)} {n}" + ("" if a.dtype == np.float32 else f" {a.dtype}")
                       for n, a in sample.items())
    local_devices = jax.local_device_count()
    devices = f"{local_devices} {jax.devices()[0].platform} device" + (
        "" if local_devices == 1 else "s")
    clauses = [f"{count} batch{'' if count == 1 else 'es'} of {fields} on {devices}"]
    clauses += [f"{k} steps per call"] if k > 1 else []
    clauses += [f"shuffled (seed {start.order.seed})"] if start.order.shuffle else []
    clauses += ["resident" if batches.resident else f"prefetch {job.data.prefetch}"]
    clauses += [start.parallel.description] if start.parallel.description else []
    line = f"process {process_id}: " + ", ".join(clauses)
    if weights is None:
        return line
    global_batch, per_device = job.train.global_batch_size, batches.per_device_batch_size
    return (f"{line}; {global_batch} rows over {jax.device_count()} devices: {per_device} per "
            f"device with {per_device * jax.device_count() - global_batch} padding rows of "
            "weight 0, the step a mean weighted over the global batch")


def devices_text(num_processes: int) -> str:
    """What the run trains on, for TensorBoard's text tab: ``1 process x 1 tpu device (TPU v5
    lite)``: processes, this process's devices, their platform and kind."""
    devices = jax.local_devices()
    kinds = ", ".join(dict.fromkeys(d.device_kind for d in devices))
    return (f"{num_processes} process{'' if num_processes == 1 else 'es'} x {len(devices)} "
            f"{devices[0].platform} device{'' if len(devices) == 1 else 's'} ({kinds})")


class Loop:
    """The loop's actors around a ``Start``: made by ``arm`` (those a failure must close are
    None until then), run by ``run``, closed by ``close`` whatever happened."""

    def __init__(self, identity: contract.Identity, job: jobs.WorkerJob, start: Start, out):
        self.identity, self.job, self.start, self.out = identity, job, start, out
        self.step = 0  # the last step dispatched (the loop's, a call's last)
        self.logger = self.notice = self.local = None
        # written on a thread of its own: at a fused tiny step's thousands of log steps a
        # second, the events' writing took the host's time between dispatches (docs/tpu.md)
        self.tracker = make_tracker(identity.run_dir, identity.process_id, job.logging.tensorboard,
                                    background=True)
        self.profiler = Profiler(identity.run_dir, identity.process_id, identity.num_processes,
                                 job.profile, client_of(identity), out, job.train.num_steps)

    def arm(self) -> None:
        """The step logger, the recovery (saves, local copies, the notice) and the list of
        step actions, in the order their contract asks (``worker.trainer.actions``)."""
        identity, job, start, out = self.identity, self.job, self.start, self.out
        platform = jax.devices()[0].platform
        self.in_flight = in_flight = InFlight(*calls.in_flight(platform, jax.local_device_count()),
                                              finished_step=start.first_step - 1)
        self.logger = metrics.StepLogger(job, identity.process_id, identity.num_processes,
                                         self.tracker, out,
                                         finished_step=lambda: in_flight.finished_step,
                                         steps_per_call=start.steps_per_call,
                                         metric_names=start.metric_names,
                                         metrics_every=start.metrics_every,
                                         read_every_s=calls.read_every_s(platform),
                                         fetch_early=platform != "cpu")

        step_calls, logs_in = start.calls, self.logger.logs_in

        def dispatch(state, inputs, first, last):
            # a call returns its rows of metrics only when one of its steps is logged
            state, step_metrics = step_calls(state, inputs, logs_in(first, last))
            # waiting on the devices is JAX time, not the host's own: inside the timed call
            if step_metrics is None:
                in_flight.add(state, last, own=False)
            else:
                in_flight.add(step_metrics, last)
            return state, step_metrics

        self.timed_step = self.logger.timed(dispatch)
        self.tracker.text("devices", devices_text(identity.num_processes), step=0)
        num_batches, unreplicate = start.order.num_batches, start.parallel.unreplicate
        self.checkpoints = recovery.Recovery(identity, job, num_batches, out, unreplicate,
                                             start.order_key)
        self.local = recovery.local_tier(identity, job, num_batches, start.order_key,
                                         unreplicate, out, start.first_step - 1)
        self.notice = recovery.notice(identity, job, out)
        task, logger = start.task, self.logger
        self.actions = [steps.Profile(self.profiler, logger.wait),
                        steps.CacheLine(start.cache, logger, out), steps.Log(logger),
                        steps.Save(self.checkpoints, logger)]
        self.actions += ([steps.LocalCopy(self.local, job.train.num_steps)]
                         if self.local is not None else [])
        self.actions += ([steps.Hook(task.on_step_end, logger, identity.process_id)]
                         if task.on_step_end else [])
        # Which periods end a run of quiet calls (steps.Quiet): those that end a call (a save,
        # the last step); a log step's rows too, unless the run dispatches them itself (its
        # fast path: a bare call to make the others); a local copy's never (its work is at the
        # first call end after its step: the next call with actions, within QUIET_S)
        rows_in_runs = not in_flight.per_call and start.calls.has_bare
        ending = periods.steps(job, periods.ENDS_A_CALL) + (
            [] if rows_in_runs else periods.steps(job, periods.A_ROW))
        self.quiet = steps.Quiet(ending, self.profiler,
                                 every_call=any(getattr(action, "every_call", False)
                                                for action in self.actions))

    def run(self):
        """Every call from the start to the last step, or to the step a preemption notice
        agreed (then process 0 saves it and the process exits 143); returns the params."""
        start, notice, out, k = self.start, self.notice, self.out, self.start.steps_per_call
        state, actions, timed_step, unflatten, quiet = (
            start.state, self.actions, self.timed_step, start.calls.unflatten, self.quiet)
        before = [action for action in actions if hasattr(action, "before")]
        stopped = False
        # Everything made so far lives as long as the loop: kept out of the garbage
        # collector's full passes, which otherwise stop the loop for up to 0.17 s at a time
        # (the 256 x 4 job at 100 steps a call on CPU: 219-227k steps/s, 250-257k frozen)
        gc.freeze()
        with interrupts.notices(notice.signalled if notice is not None else None):
            # ``step``: the last step of each call (k steps; log, checkpoint and last steps
            # are multiples of k, so they are call boundaries)
            step, num_steps = start.first_step + k - 1, self.job.train.num_steps
            while step <= num_steps:
                self.step = step
                if quiet.quiet(step) and (notice is None or not notice.held):  # steps.Quiet
                    state, step = self._quiet_calls(state, step)
                    continue
                if notice is not None and not notice.may_dispatch(step):
                    if notice.stop_step is None:  # no agreement (a peer gone): stop at once,
                        out(notice.line())        # waiting on no device (finally: as before)
                        raise SystemExit(signals.exit_code(signal.SIGTERM))
                    stopped = True  # every process stops after the agreed step
                    break
                for action in before:
                    action.before(step - k + 1, step)
                inputs = start.batches.get(step - k)  # the call's batches, from its first step
                with self.profiler.annotate(step):
                    state, step_metrics = timed_step(state, inputs, step - k + 1, step)
                call = steps.Call(step - k + 1, step, state, step_metrics, unflatten)
                for action in actions:  # worker.trainer.actions: the contract each keeps
                    action.after(call)
                quiet.ran(step)
                step += k
            self.logger.finish()  # the only device sync for logging: the last log steps, after the loop
            if stopped:  # a SIGTERM now (the launcher's, seeing a peer end) cuts no save short
                self.checkpoints.after_notice(notice, step - k, *unflatten(state))
                notice.leave()
                raise SystemExit(signals.exit_code(signal.SIGTERM))
        return unflatten(state)[0]

    def _quiet_calls(self, state: list, step: int) -> tuple[list, int]:
        """Dispatch the quiet calls (``worker.trainer.actions.Quiet``) from the one that ends
        at ``step``, for as long as they are: the state and the step of the next call.

        The loop's tightest path: on one CPU device each Python call beside the step's
        showed in its rate (the 256 x 4 step, 88-91k calls/s alone: 70-85k with a call for
        the batches, 63k with the queue's bound added per call), so the end of ``QUIET_S`` is
        looked at every ``QUIET_CHECK_CALLS`` calls, and the run of calls goes
        to the queue (``InFlight``) as one, no longer than the devices run in its ``queue_s``
        (``InFlight.ahead_calls``: a slow step's run is one call, and the queue's bounds meet
        every call), and the run's seconds count as JAX's (``StepTimer.count``) but for its
        waits for batches (``Batches.waited_s``: the host's own, as on the loop's path). The notice is told of every call
        (``Notice.passes``, no lock), as ``may_dispatch`` is, on both paths. A call with a log
        step is the rows call, its rows kept by the logger (``StepLogger.keep``) and read at the
        next call with actions, as the Log action would (``Loop.arm``'s periods). Where the bound is
        a few calls (several CPU devices: ``InFlight.per_call``), or every call returns rows
        (several processes' pmap), each call goes through the loop's own dispatch, and a run
        ends before a log step."""
        start, quiet, notice, k = self.start, self.quiet, self.notice, self.start.steps_per_call
        call, get, in_flight, clock = start.calls.bare, start.batches.get, self.in_flight, quiet.clock
        rows = start.calls.rows
        if call is None or rows is None or in_flight.per_call:  # the loop's own dispatch, its actions skipped
            if notice is not None and not notice.passes(step):
                return state, step  # a notice: the loop's own path asks may_dispatch
            self.step = step
            state, step_metrics = self.timed_step(state, get(step - k), step - k + 1, step)
            if step_metrics is not None:  # kept as the Log action keeps them (read later)
                self.logger.keep(step, step_metrics, self.logger.timer.calls)
            return state, step + k
        began, first, waited_s = clock(), step, start.batches.waited_s
        # never past the run's last step, whatever the periods say (a quiet run past it left
        # one process training on while its peers waited in a collective for a stall's kill)
        last = min(quiet.until - 1, self.job.train.num_steps,
                   step + k * (min(in_flight.max_calls, in_flight.ahead_calls(k)) - 1))
        passes = notice.passes if notice is not None else None
        # resident data of one batch: every call's inputs are one tuple, taken once (a call
        # for them beside each step's was 2-3% of the 256 x 4 step's on one CPU device)
        same = get(step - k) if start.batches.same_every_call else None
        # a call with a log step returns its rows, kept by the logger as the loop's Log action
        # keeps them (read at the next call with actions): a log step costs its rows, not the
        # actions (every 100 steps, those held the 256 x 4 step at one step a call on one CPU
        # device to 0.8 of its quiet calls' rate; docs/benchmarks.md)
        logger = self.logger
        logged, calls_before = logger.next_logging_call(step), logger.timer.calls
        try:
            while step <= last:
                if passes is not None and not passes(step):
                    break  # a notice: the loop's own path asks may_dispatch
                if step == logged:
                    state, step_metrics = rows(state, *(same or get(step - k)))
                    logger.keep(step, step_metrics, calls_before + step - first + k)
                    logged = logger.next_logging_call(step + k)
                else:
                    state = call(state, *(same or get(step - k)))
                step += k
                if not (step - first) // k % QUIET_CHECK_CALLS and clock() >= quiet.deadline:
                    break
        except BaseException:
            self.step = step  # the call that failed, as the loop's failure line says it
            raise
        self.step = step - k
        calls = (step - first) // k
        if not calls:  # a notice before the first: nothing dispatched here
            return state, step
        in_flight.add(state, step - k, own=False, calls=calls, since=began)
        # the run's seconds are JAX's but for the wait for its batches: the host's own, as on
        # the loop's path (a clock read around each call cost one CPU device's call 8-10%)
        self.logger.timer.count(calls, clock() - began - (start.batches.waited_s - waited_s))
        return state, step

    def finish(self, params) -> dict:
        """The final params by pytree path; process 0 writes them to ``params.npz``."""
        final = {jax.tree_util.keystr(path): leaf for path, leaf in
                 jax.tree_util.tree_flatten_with_path(self.start.parallel.unreplicate(params))[0]}
        if self.identity.process_id == 0:
            np.savez(os.path.join(self.identity.run_dir, "params.npz"), **final)
        if self.local is not None:  # the run is done: nothing left to restart from
            from worker.recovery import localtier

            self.local.close()
            localtier.remove_all(os.path.dirname(self.local.path))
        return final

    def close(self) -> None:
        """Whatever happened: the trace, the notice's watchers, a local copy being written,
        the input, and the records process 0 holds (written with what came)."""
        self.profiler.close()
        if self.notice is not None:
            self.notice.close()
        if self.local is not None:
            self.local.close()  # a copy being written: the restart may need it
        with interrupts.held():  # a SIGTERM now must not cut the writing of the records short
            self.start.batches.close()
            if self.logger is not None:
                self.logger.close()  # records held for other processes' values: written with what came
            self.tracker.close()
