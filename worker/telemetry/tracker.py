# long: the metrics sinks behind one interface (TensorBoard, metrics.jsonl, the writer thread, nothing) and TensorBoard's landing layout, each written on the hot path of a log step
"""Metrics sinks: TensorBoard + metrics.jsonl (process 0) or nothing (everyone else).

Callers never branch on "am I process 0": they get a ``Tracker`` either way,
as levanter's trackers do.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import struct
import sys
import threading
import time

from worker.contract import runfiles
from worker.contract import metrics
from worker.contract.metrics import METRICS_FILE

# Clients tensorboardX imports when installed, for gs:// and s3:// log directories, which
# podlaunch never writes to (its event files are in the run directory).
CLOUD_CLIENTS = ("google.cloud.storage", "boto3")


def tensorboardx():
    """The ``tensorboardX`` module, imported without ``CLOUD_CLIENTS``.

    ``tensorboardX.record_writer`` imports ``google.cloud.storage`` (and ``boto3``) at import
    when installed, for remote log directories; xprof, TensorBoard's profile plugin
    (``pip install .[profile]``), installs the former, and its import cost about 0.3 s of CPU
    (0.63 -> 0.27 s for ``import tensorboardX`` measured here): on process 0 before its
    first step, and in the launcher at every run's end. While tensorboardX is imported those
    modules are unimportable (``None`` in ``sys.modules``: its ``try``/``except ImportError``
    turns gs:// and s3:// support off); afterwards they import as usual for anyone else.
    """
    if "tensorboardX" in sys.modules:
        return sys.modules["tensorboardX"]
    blocked = [name for name in CLOUD_CLIENTS if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None
    try:
        import tensorboardX
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    return tensorboardX


class NullTracker:
    """Accepts everything and writes nothing (processes other than 0, or logging off)."""

    def scalars(self, step: int, values: dict) -> None:
        pass

    def rows(self, rows: list) -> None:
        """``scalars(step, values)`` of each ``(step, values)`` in ``rows``, in order (a batch
        of log steps, handed over in one call: ``BackgroundTracker``)."""
        for step, values in rows:
            self.scalars(step, values)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        pass

    def layout(self, own_metrics: tuple = ()) -> None:
        """TensorBoard's landing view (the Custom Scalars tab, ``layout_of``): the loss, then a
        chart of each of ``own_metrics`` (a task's or program's scalars: ``accuracy``), then
        the step times and the goodput. Once, before the first scalars; else the first
        ``scalars`` writes the view without a task's own."""

    def hparams(self, hparams: dict, metrics: dict) -> None:
        """Record the run's hyperparameters (flat: bool/int/float/str) and final metrics."""

    def flush(self) -> None:
        """Hand what was written so far to the OS (called once per batch of log steps)."""

    def drain(self) -> None:
        """Return once every call made so far is written and flushed (``BackgroundTracker``
        writes later; every other tracker has already)."""

    def close(self) -> None:
        pass


# sets of scalar tags whose events a TensorBoardTracker keeps built (TensorBoardTracker._shape)
SHAPES_KEPT = 16
_LENGTH, _CRC = struct.Struct("<Q"), struct.Struct("<I")


def record(data: bytes, crc32c) -> bytes:
    """``data`` framed as one TFRecord, the container of TensorBoard's event files: its length
    (uint64, little-endian), the masked CRC-32C of those 8 bytes (uint32), the data, the
    masked CRC-32C of the data (uint32). Masked: the CRC rotated right by 15 bits plus
    0xa282ead8, modulo 2**32. Source: TensorFlow's ``tensorflow/core/lib/io/record_writer.cc``
    and ``crc32c.h`` (``Mask``), as tensorboardX's ``RecordWriter`` writes it.

    Args:
      data: a serialized ``Event``.
      crc32c: ``bytes -> int``, the CRC-32C (Castagnoli) of its argument.
    """
    header = _LENGTH.pack(len(data))
    return b"".join((header, _CRC.pack(_masked(crc32c(header))), data,
                     _CRC.pack(_masked(crc32c(data)))))


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _file_of(events):
    """The file a tensorboardX ``EventsWriter`` appends its records to, or None where this
    tensorboardX keeps it elsewhere (then the writer's own methods are used)."""
    file = getattr(getattr(events, "_py_recordio_writer", None), "_writer", None)
    return file if file is not None and hasattr(file, "write") and hasattr(file, "flush") else None


class TensorBoardTracker(NullTracker):
    """Writes one TensorBoard event file with tensorboardX's event writer, in this thread.

    Each ``scalars`` call is one ``Event`` (every value a ``simple_value``, as ``add_scalar``
    writes them) serialized, framed (``record``) and appended to the buffer of the file
    ``tensorboardX.event_file_writer.EventsWriter`` opened, the way that writer appends it;
    ``flush`` (once per batch of log steps) hands the buffer to the OS, so a run killed by
    SIGKILL loses at most the batch being written, and ``close`` writes the rest.

    Not ``SummaryWriter``: its writer passes every event through a ``multiprocessing.Queue``
    (a semaphore, a pickle through a pipe, a feeder thread and a writer thread): 35 us of CPU
    per event over its threads, all under the training loop's interpreter lock, against 10 us
    here (``bench/bench_tracker.py``; at a few thousand log steps a second, as a tiny model
    fused on a TPU logs, that is the host's time between dispatches).
    """

    def __init__(self, logdir: str, process_id: int = 0):
        tensorboardx()  # only process 0 pays for the import (without the cloud clients)
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.summary import custom_scalars

        os.makedirs(logdir, exist_ok=True)
        # the file named by its writer's process: tensorboardX names it by time and host,
        # so two writers on one host in one second would share one name, and a second
        # writer (a broken process-0-only rule) would be invisible
        self._events = EventsWriter(os.path.join(logdir, "events"),
                                    filename_suffix=f".process-{process_id:03d}")
        self._logdir, self._process_id, self._writer = logdir, process_id, EventsWriter
        self._own: dict = {}  # process id -> the EventsWriter of its own run (process_run)
        self._event, self._summary = Event, Summary
        self._custom_scalars, self._laid_out = custom_scalars, False
        self._shapes: dict = {}  # tags -> what scalars fills (_shape)
        self._file = _file_of(self._events)
        from tensorboardX.crc32c import crc32c  # native where the crc32c package is installed

        self._crc32c = crc32c

    def layout(self, own_metrics: tuple = ()) -> None:
        if not self._laid_out:
            self._laid_out = True
            self._write(self._custom_scalars(layout_of(own_metrics)))

    def _write(self, summary, step: int | None = None, events=None) -> None:
        event = self._event(wall_time=time.time(), summary=summary)
        if step is not None:
            event.step = int(step)
        (events or self._events).write_event(event)

    def scalars(self, step: int, values: dict) -> None:
        """One event of ``values`` (tag -> number) at ``step``; each process's own step time
        (``step_time_s/process_NNN``) goes to that process's own run instead, as
        ``own_step_time_s`` (``worker.contract.metrics``).

        Log steps carry the same tags step after step, so the events of one set of tags are
        built once (``_shape``) and only their time, step and values are set on each call
        before they are serialized: building a ``Summary`` of seven values and its ``Event``
        afresh was a third of an event's CPU time (bench/bench_tracker.py)."""
        shared, event, owns = self._shape(tuple(values))
        now, step = time.time(), int(step)
        event.wall_time, event.step = now, step
        for value, tag in zip(event.summary.value, shared):
            value.simple_value = float(values[tag])
        self._append(self._events, self._file, event)
        for tag, own, events, file in owns:
            own.wall_time, own.step = now, step
            own.summary.value[0].simple_value = float(values[tag])
            self._append(events, file, own)

    def _append(self, events, file, event) -> None:
        """``events.write_event(event)``: framed here (``record``) and appended to ``file``,
        the one tensorboardX's writer opened (``_file_of``; None: the writer's own path).
        tensorboardX's own framing, a Python call per field, was half of what an event cost
        after the events were built once (bench/bench_tracker.py)."""
        if file is None:
            events.write_event(event)
        else:
            file.write(record(event.SerializeToString(), self._crc32c))

    def _shape(self, tags: tuple) -> tuple:
        """The events ``scalars`` fills for ``tags``: the shared tags, their ``Event``, and
        per own step time its tag, its ``Event``, its run's writer and that writer's file. Kept for the last
        ``SHAPES_KEPT`` sets of tags (a program may log other scalars at some steps)."""
        shape = self._shapes.get(tags)
        if shape is None:
            self.layout()  # a no-op once laid out
            Value, prefix = self._summary.Value, metrics.PROCESS_STEP_TIME
            shared = [tag for tag in tags if not tag.startswith(prefix)]
            event = self._event(summary=self._summary(value=[Value(tag=tag) for tag in shared]))
            owns = []
            for tag in tags:
                if tag.startswith(prefix):
                    events = self._own_run(int(tag[len(prefix):]))
                    owns.append((tag, self._event(summary=self._summary(
                        value=[Value(tag=metrics.OWN_STEP_TIME)])), events, _file_of(events)))
            if len(self._shapes) >= SHAPES_KEPT:
                self._shapes.pop(next(iter(self._shapes)))
            shape = self._shapes[tags] = (shared, event, owns)
        return shape

    def _own_run(self, process_id: int):
        """The event writer of process ``process_id``'s own run, opened at its first value."""
        events = self._own.get(process_id)
        if events is None:
            logdir = os.path.join(self._logdir, metrics.process_run(process_id))
            os.makedirs(logdir, exist_ok=True)
            events = self._own[process_id] = self._writer(
                os.path.join(logdir, "events"), filename_suffix=f".process-{self._process_id:03d}")
        return events

    def text(self, tag: str, text: str, step: int = 0) -> None:
        from tensorboardX.summary import text as text_summary

        self._write(text_summary(tag, text), step)
        self.flush()

    def hparams(self, hparams: dict, metrics: dict) -> None:
        # SummaryWriter.add_hparams would open a second writer in a subdirectory;
        # writing the plugin's three summaries here keeps one event file, and the
        # metric tags are scalars this file already holds.
        from tensorboardX.summary import hparams as hparams_summaries

        for summary in hparams_summaries(hparams, metrics):
            self._write(summary)
        self.flush()

    def flush(self) -> None:
        # The file's own flush: EventsWriter.flush also fsyncs, about 1 ms a call here, and
        # a process's end (close) or the OS writes the pages anyway; only a machine's crash
        # loses what is not yet on disk
        for events in (self._events, *self._own.values()):
            file = _file_of(events)
            if file is not None:
                file.flush()
            else:  # another tensorboardX: its own flush
                events.flush()

    def close(self) -> None:
        for events in (self._events, *self._own.values()):
            events.close()


class JsonlTracker(NullTracker):
    """Appends one JSON object per ``scalars`` call: ``{"step": 40, "loss": 0.0123, ...}``.

    Lines reach the file at ``flush`` (once per batch of log steps) and ``close``.

    Keys are the TensorBoard tags; NaN and infinities are written as ``null`` so
    every line is strict JSON.
    """

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._file = open(path, "a", encoding="utf-8", opener=runfiles.opener)
        self._keys: dict = {}  # tags -> their JSON keys ("loss": )

    def scalars(self, step: int, values: dict) -> None:
        if "step" in values:  # a scalar named step overwrites the key, as it always has
            record = {"step": step}
            record.update({tag: (float(v) if math.isfinite(float(v)) else None)
                           for tag, v in values.items()})
            self._file.write(json.dumps(record) + "\n")
            return
        # json.dumps's own text (its separators, ``float.__repr__`` for numbers), with each
        # set of tags encoded once: a dict and json.dumps per log step was twice the CPU
        keys = self._keys.get(tuple(values))
        if keys is None:
            if len(self._keys) >= SHAPES_KEPT:
                self._keys.pop(next(iter(self._keys)))
            keys = self._keys[tuple(values)] = [json.dumps(tag) + ": " for tag in values]
        parts = [f'{{"step": {int(step)}']
        for key, value in zip(keys, values.values()):
            value = float(value)
            parts.append(key + (repr(value) if math.isfinite(value) else "null"))
        self._file.write(", ".join(parts) + "}\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class Trackers(NullTracker):
    """Sends every call to each of several trackers."""

    def __init__(self, *trackers):
        self._trackers = trackers

    def scalars(self, step: int, values: dict) -> None:
        for tracker in self._trackers:
            tracker.scalars(step, values)

    def rows(self, rows: list) -> None:
        for tracker in self._trackers:
            tracker.rows(rows)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        for tracker in self._trackers:
            tracker.text(tag, text, step)

    def layout(self, own_metrics: tuple = ()) -> None:
        for tracker in self._trackers:
            tracker.layout(own_metrics)

    def hparams(self, hparams: dict, metrics: dict) -> None:
        for tracker in self._trackers:
            tracker.hparams(hparams, metrics)

    def flush(self) -> None:
        for tracker in self._trackers:
            tracker.flush()

    def drain(self) -> None:
        for tracker in self._trackers:
            tracker.drain()

    def close(self) -> None:
        for tracker in self._trackers:
            tracker.close()


class BackgroundTracker(NullTracker):
    """Hands every call to ``tracker`` (``scalars``, ``text``, ``hparams``, ``flush``) to one
    writer thread, which makes them in the order they were made; ``close`` writes what is
    queued, then closes ``tracker``.

    For the training loop's thread on an accelerator: a log step's TensorBoard event and
    metrics.jsonl line cost the host about 17 us here (bench/bench_tracker.py) and more on a
    TPU v5e's host, and at 100 steps a call of the 256 x 4 job a log step comes every 0.3 ms,
    which the loop also needs to dispatch the next call (docs/tpu.md). On the writer thread that work
    runs while the loop's thread waits in JAX's dispatch, which leaves the interpreter lock.

    A call's values are copied when it is made. An error of the writer's (a full disk) is
    raised by the loop's next call, or by ``close``; the calls after it are dropped.
    """

    def __init__(self, tracker):
        self._tracker = tracker
        self._calls: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True, name="tracker")
        self._thread.start()

    def _serve(self) -> None:
        while True:
            call = self._calls.get()
            try:
                if call is None:
                    return
                if self._error is None:
                    name, args = call
                    try:
                        getattr(self._tracker, name)(*args)
                    except BaseException as exc:  # noqa: BLE001 - raised on the loop's thread
                        self._error = exc
            finally:
                self._calls.task_done()

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _put(self, name: str, *args) -> None:
        self._raise_error()
        self._calls.put((name, args))

    def scalars(self, step: int, values: dict) -> None:
        self._put("scalars", step, dict(values))

    def rows(self, rows: list) -> None:
        # one hand-over a batch: a queue's put per log step cost the loop's thread 2-3 us
        # each on the v5e's host, at thousands of log steps a second
        self._put("rows", [(step, dict(values)) for step, values in rows])

    def text(self, tag: str, text: str, step: int = 0) -> None:
        self._put("text", tag, text, step)

    def layout(self, own_metrics: tuple = ()) -> None:
        self._put("layout", tuple(own_metrics))

    def hparams(self, hparams: dict, metrics: dict) -> None:
        self._put("hparams", dict(hparams), dict(metrics))

    def flush(self) -> None:
        self._put("flush")

    def drain(self) -> None:
        """Wait until every call made so far is written, flushed to the OS (a task's hook may
        end the process next: ``worker.trainer.actions.Hook``); raise the writer's error."""
        self._put("flush")
        self._calls.join()
        self._raise_error()

    def close(self) -> None:
        """Write everything queued, then close the tracker (waits for the writer)."""
        if self._thread.is_alive():
            self._calls.put(None)
            self._thread.join()
        self._tracker.close()
        self._raise_error()


LAYOUT = {"podlaunch": {
    "loss": ["Multiline", ["^loss$"]],
    # one line per process's own run (worker.contract.metrics.process_run), a colour each
    "own step time of each process (s)": ["Multiline", [f"^{metrics.OWN_STEP_TIME}$"]],
    "step time (s)": ["Multiline", ["^step_time_s$"]],
    "goodput": ["Multiline", ["^goodput/goodput$"]],
}}


def layout_of(own_metrics: tuple = ()) -> dict:
    """The Custom Scalars tab's layout (tensorboardX's ``custom_scalars``): ``LAYOUT`` with a
    chart of each of ``own_metrics`` (a task's ``accuracy``) after the loss. The loss first,
    then one chart of every process's own step time (the Scalars tab gives each process a
    card and a y-scale of its own, so "which host is slow" cannot be read there), then the
    launcher's goodput ledger."""
    charts = dict(LAYOUT["podlaunch"])
    loss = {"loss": charts.pop("loss")}
    own = {name: ["Multiline", [f"^{re.escape(name)}$"]] for name in own_metrics
           if name not in loss and name not in charts}
    return {"podlaunch": {**loss, **own, **charts}}


def make_tracker(run_dir: str, process_id: int, enabled: bool, background: bool = False):
    """Process 0: TensorBoard events and ``metrics.jsonl`` in ``<run_dir>/tensorboard``,
    written on a thread of their own with ``background`` (``BackgroundTracker``).

    Every other process, or logging.tensorboard off: a NullTracker.
    """
    if process_id == 0 and enabled:
        logdir = os.path.join(run_dir, "tensorboard")
        tracker = Trackers(TensorBoardTracker(logdir, process_id=process_id),
                           JsonlTracker(os.path.join(logdir, METRICS_FILE)))
        return BackgroundTracker(tracker) if background else tracker
    return NullTracker()
