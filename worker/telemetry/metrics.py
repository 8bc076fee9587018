# long: the step logger whole: what a log step keeps, how it is timed, read and written, one state shared by each of them
"""What a worker measures and logs at log steps: timing, norms, the per-process gather.

The training loop stays a few lines; everything it reports goes through one
``StepLogger``, which reads log steps back and prints them; the timing is
``worker.telemetry.steptimer.StepTimer``'s and the writing of the scalars (held on process 0 until
every process's own step time is in) ``worker.telemetry.records.Records``', each of its own:

* ``timed(step_fn)`` wraps the pmapped step to time its first call (trace +
  compile + dispatch, so ``compile_time_s`` needs no device sync), to count
  steps, and to sum the time spent inside the calls. Per step that is two
  clock reads and no device sync.
* ``after_dispatch(step, step_metrics)``: at a log step, takes its times (below)
  and keeps its output arrays. Log steps are read in batches: once the
  oldest kept one has finished (``worker.trainer.calls.InFlight`` says which steps
  have: on CPU at most 2 calls are in flight, so step s has finished once the
  call 2 after it has been dispatched) and ``read_every_s`` has passed since the last read. A batch is
  one read of its rows, one write of its progress lines, one post of this
  process's own step times to process 0 (``worker.runtime.gather``: the coordination
  service's key-value store, no device collective), then process 0 writes the
  TensorBoard scalars and metrics.jsonl of every log step whose per-process
  values have all arrived, and the losses are checked. Nothing here waits for
  a step or for another process. With slow steps (longer than
  ``read_every_s``) every log step is its own batch, read ``lag`` steps late;
  with fast ones, a batch holds the log steps of ``read_every_s``, so the
  cost per step stays small (docs/monitoring.md has the figures).
* ``flush()`` (before a checkpoint, a task's hook): reads every kept log step,
  waiting for it.
* ``finish()`` after the loop: ``flush()``, then process 0 waits for the other
  processes' last values and writes everything it holds.
* ``close()`` when the loop ends early (an error, SIGTERM): reads the kept
  log steps that have finished, then process 0 writes what it holds, waiting
  at most 0.5 s for the other processes' values.
* A SIGTERM that arrives while log steps are taken off the queue, printed,
  held or written is raised once they are (``worker.runtime.interrupts.held``): a
  progress line on the console is always a record in TensorBoard.

Two step times (seconds per step since the previous log step), taken when a
log step has been dispatched (once ``lag`` steps are in flight, a dispatch
returns when the step ``lag`` before it has finished, so the intervals are
the steps' own):

* ``step_time_s``: wall time between the dispatches of two log steps. In a
  synchronous data-parallel run every process waits for the slowest one
  inside the collectives, so this is the same on every process: it says how
  fast the run goes, not who holds it back.
* ``own_step_time_s``: that wall time minus the time this process spent
  inside JAX (the step calls, where a process blocks when its peers are
  behind, and reading log steps back): its own host work per step (input,
  Python, a task's hooks, logging). A straggling host (slow input, a busy
  CPU) has the largest. Time blocked in a step call is left out because it
  mixes a process's own dispatch with waiting for peers (the first steps wait
  for the slowest compilation); so a device that computes slowly is not
  singled out here, it shows in everyone's ``step_time_s``.
"""

from __future__ import annotations

import collections
import itertools
import math
import time
from typing import Callable

import numpy as np

from worker.contract import job as jobs
from worker.contract import redact, wire
from worker.contract.metrics import STEP_METRICS
from worker.runtime import interrupts
from worker.telemetry.records import Records
from worker.telemetry.spectext import flatten, spec_markdown
from worker.telemetry.steptimer import StepTimer

NONFINITE_MODES = ("stop", "warn")


def fetch_when_done(array) -> None:
    """Ask for ``array``'s copy to the host now, to be made as soon as the call that computes
    it ends (``jax.Array.copy_to_host_async``; anything else: nothing to do).

    The later read of a log step then only takes what is already on the host. Read without
    it on a TPU v5e, a finished call's metrics took 0.45 ms a transfer, and a read of a
    quarter second's log steps (about 1,000 of them at 100 steps a call) held the host, and
    so the chip's queue, for about 0.12 s (bench/tpu_check.py; docs/tpu.md).
    """
    copy = getattr(array, "copy_to_host_async", None)
    if copy is not None:
        copy()


def _ready(array) -> bool:
    """Whether a device array's value has been computed (``jax.Array.is_ready``; anything
    else: yes)."""
    ready = getattr(array, "is_ready", None)
    return True if ready is None else ready()


def finished_upto(kept, begin: int, done: int) -> int:
    """The index past the last of ``kept[begin:]`` known to have finished: those whose call
    ends at or before ``done`` (a step the queue saw finish), then those whose rows are ready.

    Calls finish in the order they were dispatched (each takes the state the one before
    returned), so readiness is ``True ... True False ... False`` along ``kept``: the newest is
    asked first, then the boundary is bisected: a few ``is_ready`` calls for any number of
    kept log steps, where each was asked in turn before (a fused call's ten log steps share
    one array; ``is_ready`` costs the v5e's host 5-9 us: bench/host_costs.py, docs/tpu.md).

    Args:
      kept: the logger's kept log steps, oldest first (index 5: the call's last step; index
        3: its rows, a device array).
      begin: those before it are finished already.
      done: the last step known finished.
    """
    end, size = begin, len(kept)
    while end < size and kept[end][5] <= done:
        end += 1
    if end == size or not _ready(kept[end][3]):
        return end
    if _ready(kept[size - 1][3]):
        return size
    low, high = end + 1, size - 1  # kept[end] ready, kept[size - 1] not
    while low < high:
        middle = (low + high) // 2
        if _ready(kept[middle][3]):
            low = middle + 1
        else:
            high = middle
    return low


def json_value(value: float) -> float | None:
    """``value`` for strict JSON: non-finite numbers (NaN, inf) become None (``null``)."""
    return value if math.isfinite(value) else None


class StepLogger:
    """Times the training loop and writes what it measures at log steps.

    Args:
      job: the worker's job (``job.json``): reads ``train``, ``optimizer`` and
        ``logging`` (``log_every_steps``, ``tensorboard``, ``on_nonfinite_loss``);
        all of it is shown as TensorBoard text and hparams.
      process_id, num_processes: this process's identity.
      tracker: a ``worker.telemetry.tracker`` tracker (real on process 0, no-op elsewhere).
      out: prints text (progress lines go to the launcher); called once per
        batch with its lines joined by newlines.
      clock: seconds, monotonic (``time.perf_counter``).
      lag: steps after which a dispatched step has finished, without ``finished_step``.
      read_every_s: seconds between reads of finished log steps (see the module).
      gather: a ``worker.runtime.gather.KeyValueGather``-like object, or None to make
        one when TensorBoard is on and there are several processes.
      gather_timeout_s: seconds process 0 waits at the end for the other
        processes' last values.
      steps_per_call: optimizer steps each call of the timed step runs
        (``train.steps_per_call``); ``lag`` is counted in steps.
      metrics_every: the call's rows of metrics (``worker.trainer.train.make_train_step``), every
        log step among them (``worker.trainer.calls.metrics_every``); default ``steps_per_call``.
      finished_step: returns the last step known to have finished (``worker.trainer.calls.InFlight``'s
        ``finished_step``); default: the step ``lag`` steps before the one dispatched.
      fetch_early: ask for each log step's copy to the host as it is dispatched
        (``fetch_when_done``): on TPU and GPU. On CPU devices the device's memory is the
        host's, and the ask was 31% of a log step's logging (``Log.after``, py-spy, the
        256 x 4 job at one step a call: docs/benchmarks.md): False there.
    """

    def __init__(self, job: jobs.WorkerJob, process_id: int, num_processes: int, tracker,
                 out=print,
                 clock: Callable[[], float] = time.perf_counter, lag: int = 2,
                 read_every_s: float = 0.25, gather=None, gather_timeout_s: float = 60.0,
                 steps_per_call: int = 1, metric_names: tuple = STEP_METRICS,
                 metrics_every: int | None = None,
                 finished_step: Callable[[], int] | None = None, fetch_early: bool = True):
        logging = job.logging
        self.fetch_early = fetch_early
        self.metric_names = tuple(metric_names)  # the step's metrics columns (a task's added)
        self.log_every = logging.log_every_steps
        self.on_nonfinite = logging.on_nonfinite_loss
        if self.on_nonfinite not in NONFINITE_MODES:
            raise ValueError(f"logging.on_nonfinite_loss: expected one of {NONFINITE_MODES}, "
                             f"got {self.on_nonfinite!r}")
        self.num_steps = job.train.num_steps
        self.global_batch_size = job.train.global_batch_size
        self.learning_rate = job.optimizer.learning_rate
        self.process_id, self.num_processes = process_id, num_processes
        self.tracker, self.out, self.clock, self.lag = tracker, out, clock, lag
        self.finished_step = finished_step
        self.read_every_s, self.gather_timeout_s = read_every_s, gather_timeout_s
        # Every process takes the same branch (the spec is shared): all post
        # their own step times to process 0 or none do.
        if gather is None and logging.tensorboard and num_processes > 1:
            from worker.runtime.gather import KeyValueGather

            gather = KeyValueGather(process_id, num_processes)
        self.records = Records(tracker, gather, process_id, num_processes, self.num_steps,
                               flatten(redact.masked(job.to_dict(), job.secrets)), out, clock)
        self.last_loss: float | None = None
        self.timer = StepTimer(clock, steps_per_call)
        self.steps_per_call = steps_per_call
        self.metrics_every = metrics_every or steps_per_call
        # Log steps dispatched, not read yet: [step, calls, times or None, step_metrics, row
        # of step_metrics, last step of its call].
        self._kept: collections.deque = collections.deque()
        self._taken: tuple | None = None   # (calls, times) of the call timed last
        self._found: tuple | None = None   # the log steps after_dispatch last found finished
        self._last_read = -float("inf")
        self._finished = 0                 # the first this many kept steps have finished (timed)
        self._stopped = False              # a non-finite loss stopped the run: log nothing after it
        tracker.text("spec", spec_markdown(job), step=0)
        # TensorBoard's landing view: the loss, then the task's own metrics (accuracy)
        tracker.layout(tuple(n for n in self.metric_names if n not in STEP_METRICS))

    @property
    def compile_time_s(self) -> float | None:
        """The first call's seconds (trace, compile, dispatch), until the first log step."""
        return self.timer.compile_time_s

    def timed(self, step_fn: Callable) -> Callable:
        """``step_fn`` that times its first call and counts every call (``StepTimer.timed``)."""
        return self.timer.timed(step_fn)

    def is_log_step(self, step: int) -> bool:
        """Log steps: every ``log_every_steps``-th step, and the last one."""
        return step % self.log_every == 0 or step == self.num_steps

    def logs_in(self, first: int, last: int) -> bool:
        """Whether a log step falls in steps ``first`` .. ``last`` (a call's): only such a call
        returns its rows of metrics (``worker.trainer.calls.StepCalls``)."""
        return (last // self.log_every > (first - 1) // self.log_every
                or first <= self.num_steps <= last)

    def after_dispatch(self, step: int, step_metrics) -> None:
        """After dispatching ``step``: keep it if it is a log step; time and read what finished.

        A log step is timed when it is known to have finished (step + lag has
        been dispatched), and read in the next batch that is due.

        Args:
          step: the step just dispatched (counts from 1).
          step_metrics: ``[local_device_count, len(STEP_METRICS)]`` float32 device
            array, the train step's loss, grad_norm and param_norm (equal on every
            device; ``worker.trainer.train.make_train_step``). One array, so reading a log
            step back is one transfer. From a fused call
            (``steps_per_call`` k > 1): ``[local_device_count, k, len(STEP_METRICS)]``,
            every step of the call; ``step`` is its last, whose row is logged. None: a
            call with no log step (``logs_in``), which returns no rows.

        Raises:
          FloatingPointError: see ``read``.
        """
        if step_metrics is not None:
            self.keep(step, step_metrics, self.timer.calls)
        done = self.finished_step() if self.finished_step is not None else step - self.lag
        # finished: its call is known to have (the queue waited for it), or its rows are on
        # hand (a queue that waits only every 0.1 s would time a short run's log steps all at
        # its end, a few microseconds apart)
        newly = self._finished
        self._finished = finished_upto(self._kept, self._finished, done)
        if self._finished > newly:  # found finished together: the interval is theirs alike
            found = list(itertools.islice(self._kept, newly, self._finished))
            # found at this call, up to a log period after they finished: a flush at this
            # same call (a checkpoint's) times them again with what it waits for
            self._found = (self.timer.calls, self.timer.snapshot(), self._taken, found)
            self._time(found)
        now = self.clock()
        # read those found at earlier calls: those found now stay until the next read, so a
        # flush at this call may time them again with its own
        if newly and now - self._last_read >= self.read_every_s:
            with interrupts.held():  # taken off _kept: printed and held whole, or not at all
                self._finished -= newly
                self.read([self._kept.popleft() for _ in range(newly)])
        elif self.records.held and now - self.records.last_collect >= self.read_every_s:
            # Process 0 between its own reads: other processes' values may have come.
            self.records.collect()
            self.timer.charge(self.records.last_collect - now)  # logging's work, as in read()

    def keep(self, step: int, step_metrics, calls: int) -> None:
        """Keep the log steps of the call that ends at ``step`` (its rows ``step_metrics``, as
        ``after_dispatch`` takes them), dispatched when ``calls`` steps had been
        (``StepTimer.calls`` counting this call): read once found finished, by a later
        ``after_dispatch``, ``flush`` or ``finish``. The loop's quiet calls keep their log
        steps here alone (``worker.trainer.loop``)."""
        first = step - self.steps_per_call  # the call runs steps first + 1 .. step
        kept = len(self._kept)
        for logged in range(first + self.metrics_every, step + 1, self.metrics_every):
            if self.is_log_step(logged):
                row = (logged - first) // self.metrics_every - 1
                self._kept.append([logged, calls, None, step_metrics, row, step])
        if len(self._kept) > kept and self.fetch_early:
            fetch_when_done(step_metrics)

    def next_logging_call(self, step: int) -> float:
        """The end of the first call, of those ending at ``step``, ``step + k``, ..., that
        holds a log step (``logs_in``; k = ``steps_per_call``); inf where none does."""
        k = self.steps_per_call
        first = step - k + 1  # the first step of the call that ends at step
        logged = -(-first // self.log_every) * self.log_every  # the first log period's step
        if first <= self.num_steps < logged:
            logged = self.num_steps  # the last step is logged too
        if logged > self.num_steps:
            return math.inf
        return step + max(0, -(-(logged - step) // k)) * k

    def wait(self, array) -> None:
        """``jax.block_until_ready(array)``, the time counted as JAX's, not the host's own."""
        self.timer.wait(array)

    def _time(self, entries: list) -> None:
        """Set each of ``entries``' (step_time_s, own_step_time_s) from the interval since the
        mark to its newest (entries known finished at one time share it: the steps between
        took that long on average; the log steps of one call are timed as a whole)."""
        newest = entries[-1][1]
        if self._taken is None or self._taken[0] != newest:
            self._taken = (newest, self.timer.take(newest))
        for entry in entries:
            entry[2] = self._taken[1]

    def flush(self) -> None:
        """Read every kept log step, waiting for it (before a checkpoint, a task's hook)."""
        with interrupts.held():
            if self._kept:
                kept, self._kept, self._finished = list(self._kept), collections.deque(), 0
                self.read(kept)

    def finish(self) -> None:
        """After the last dispatch: ``flush``, then write every record process 0 holds.

        Process 0 waits up to ``gather_timeout_s`` for the other processes'
        values; a value that does not come is written as NaN.
        """
        self.flush()
        self.records.drain(self.gather_timeout_s)

    def close(self, wait_s: float = 0.5) -> None:
        """Log what can be logged without waiting for a device (the loop ended early).

        Reads the kept log steps that have finished (``lag`` steps before the
        last dispatch), unless a non-finite loss stopped the run; then process 0
        writes every record it holds, waiting up to ``wait_s`` for the other
        processes' values (they may be logging the same steps as it ends):
        values that do not come are NaN (``null`` in metrics.jsonl). Errors
        are swallowed: the process is ending already.
        """
        with interrupts.held():
            finished = list(self._kept)[:self._finished]
            self._kept.clear()
            self._finished = 0
            if finished and not self._stopped:
                try:
                    # Other processes do not post: process 0 may be gone with the store.
                    self.read(finished, post=self.process_id == 0)
                except Exception:  # noqa: BLE001 - a non-finite loss among them, or a closed stdout
                    pass
            self.records.drain(wait_s)

    def read(self, kept: list, post: bool = True) -> list:
        """Read a batch of finished log steps: progress lines, own times posted, scalars written.

        Args:
          kept: ``[step, calls, times, step_metrics]`` entries in step order;
            ``times`` is None for a step not known to have finished: it is
            waited for, then timed.
          post: send this process's own step times to process 0 (``close``
            skips it on other processes).

        Returns:
          Each step's scalars (tag -> float), also on processes other than 0.
          On process 0 with several processes the ``step_time_s/process_NNN``
          values are added to these dicts when all have arrived.

        Raises:
          FloatingPointError: a loss is NaN or infinite and
            ``logging.on_nonfinite_loss`` is ``stop``; the message names the step,
            and so does the exception's ``step`` attribute. The steps before it
            are logged, the ones after it are not.
        """
        # flush(): wait for each in turn, so each gets its own interval; those finished
        # already share the one since the last timed (timed one by one, microseconds apart,
        # a checkpoint's flush showed millions of steps/s, then the next line a fraction)
        found, self._found = self._found, None
        if found is not None and found[0] == self.timer.calls and any(
                entry[2] is None for entry in kept) and all(
                any(entry is k for k in kept) for entry in found[3]):
            # the log steps found finished at this call (late: the quiet calls after them
            # had run too) and those waited for now share one interval: timed apart, the
            # waited one got a few microseconds for its steps (a checkpoint step's line
            # showed 0.3-1 million steps/s, the line before it half its rate)
            self.timer.restore(found[1])
            self._taken = found[2]
            for entry in found[3]:
                entry[2] = None
        untimed = [entry for entry in kept if entry[2] is None]
        while untimed:
            # those finished already (when, exactly, is not known) and the first waited for
            # (known: now) share the interval
            ready = finished_upto(untimed, 0, -1)
            if ready < len(untimed):
                self.wait(untimed[ready][3])  # waiting for the device: not host work
                ready += 1
            self._time(untimed[:ready])
            del untimed[:ready]
        start = self.clock()
        arrays = {id(entry[3]): entry[3] for entry in kept}  # a call's log steps share one
        # each already asked for (fetch_early) or in the host's memory (CPU devices): read as
        # it is (jax.device_get asked again for each, through its tree and a profiler
        # annotation: 15% of a log step's logging on one CPU device)
        fetched = {key: np.asarray(array) for key, array in arrays.items()}
        records, lines, error = [], [], None
        for step, _, (step_time_s, own_step_time_s), step_metrics, row, _ in kept:
            rows = fetched[id(step_metrics)]  # device 0's rows (of a fused call: log steps')
            values = dict(zip(self.metric_names,
                              map(float, rows[0].reshape(-1, len(self.metric_names))[row])))
            loss_value = values["loss"]
            self.last_loss = loss_value
            lines.append(wire.Progress(step, self.num_steps, loss_value, 1.0 / step_time_s,
                                       step_time_s, own_step_time_s,
                                       wire.own_metrics(values, self.metric_names)).text())
            values.update(learning_rate=self.learning_rate, step_time_s=step_time_s,
                          examples_per_s=self.global_batch_size / step_time_s)
            if self.timer.compile_time_s is not None:
                values["compile_time_s"] = self.timer.compile_time_s
                self.timer.compile_time_s = None  # once, at the first log step
            if step == self.num_steps:
                values["final_loss"] = loss_value
            records.append((step, own_step_time_s, values))
            if not math.isfinite(loss_value):
                message = f"loss is {loss_value} at step {step}"
                if self.on_nonfinite == "stop":
                    error = FloatingPointError(
                        f"{message} (logging.on_nonfinite_loss: stop; set it to warn to keep going)")
                    error.step = step
                    break
                lines.append(f"warning: {message}; continuing (logging.on_nonfinite_loss: warn)")
        self.out("\n".join(lines))
        self.records.add(records, post)
        end = self.clock()
        # A batch's reading and writing is logging's work, not the host's own
        # step time: charged to the one step after it, it would spike the curves.
        self.timer.charge(end - start)
        self._last_read = end
        if error is not None:
            self._stopped = True
            raise error
        return [values for _, _, values in records]
