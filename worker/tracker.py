"""Metrics sinks: TensorBoard + metrics.jsonl (process 0) or nothing (everyone else).

Callers never branch on "am I process 0": they get a ``Tracker`` either way,
as levanter's trackers do.
"""

from __future__ import annotations

import json
import math
import os
import sys

from worker import runfiles

METRICS_FILE = "metrics.jsonl"

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

    def text(self, tag: str, text: str, step: int = 0) -> None:
        pass

    def hparams(self, hparams: dict, metrics: dict) -> None:
        """Record the run's hyperparameters (flat: bool/int/float/str) and final metrics."""

    def flush(self) -> None:
        """Hand what was written so far to the OS (called once per batch of log steps)."""

    def close(self) -> None:
        pass


class TensorBoardTracker(NullTracker):
    """Writes TensorBoard event files with tensorboardX.

    tensorboardX's writer thread flushes every ``flush_s`` seconds and
    ``close`` flushes the rest, so a run stopped by SIGTERM or an exception
    keeps everything, and one killed by SIGKILL loses at most ``flush_s``.
    An explicit flush per log step would cost ~1 ms (measured: 1.5 ms with,
    0.4 ms without, for 4 scalars), a third of a step of the seed's model.
    """

    def __init__(self, logdir: str, flush_s: float = 2.0, max_queue: int = 1024,
                 process_id: int = 0):
        SummaryWriter = tensorboardx().SummaryWriter  # only process 0 pays for the import
        from tensorboardX.proto.summary_pb2 import Summary

        os.makedirs(logdir, exist_ok=True)
        # max_queue: a batch of log steps is put at once; tensorboardX's default
        # (10) would block the training loop until its writer thread caught up.
        # the file named by its writer's process: tensorboardX names it by time and host,
        # so two writers on one host in one second would share one name, and a second
        # writer (a broken process-0-only rule) would be invisible
        self._writer = SummaryWriter(logdir=logdir, flush_secs=flush_s, max_queue=max_queue,
                                     filename_suffix=f".process-{process_id:03d}")
        self._summary = Summary
        # the Custom Scalars tab: the loss first, then one chart of every process's own step
        # time (the Scalars tab gives each process a card and a y-scale of its own, so "which
        # host is slow" cannot be read there), then the launcher's goodput ledger
        self._writer.add_custom_scalars(LAYOUT)

    def scalars(self, step: int, values: dict) -> None:
        # One event holding every value: what add_scalar writes per tag (a
        # simple_value), at a seventh of the CPU time for 10 tags (0.1 ms, not
        # 0.74: tensorboardX checksums each event record in pure Python).
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=float(value))
                                 for tag, value in values.items()])
        self._writer._get_file_writer().add_summary(summary, global_step=step)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        self._writer.add_text(tag, text, global_step=step)
        self._writer.flush()

    def hparams(self, hparams: dict, metrics: dict) -> None:
        # SummaryWriter.add_hparams would open a second writer in a subdirectory;
        # writing the plugin's three summaries here keeps one event file, and the
        # metric tags are scalars this file already holds.
        from tensorboardX.summary import hparams as hparams_summaries

        for summary in hparams_summaries(hparams, metrics):
            self._writer._get_file_writer().add_summary(summary)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class JsonlTracker(NullTracker):
    """Appends one JSON object per ``scalars`` call: ``{"step": 40, "loss": 0.0123, ...}``.

    Lines reach the file at ``flush`` (once per batch of log steps) and ``close``.

    Keys are the TensorBoard tags; NaN and infinities are written as ``null`` so
    every line is strict JSON.
    """

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._file = open(path, "a", encoding="utf-8", opener=runfiles.opener)

    def scalars(self, step: int, values: dict) -> None:
        record = {"step": step}
        record.update({tag: (float(v) if math.isfinite(float(v)) else None)
                       for tag, v in values.items()})
        self._file.write(json.dumps(record) + "\n")

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

    def text(self, tag: str, text: str, step: int = 0) -> None:
        for tracker in self._trackers:
            tracker.text(tag, text, step)

    def hparams(self, hparams: dict, metrics: dict) -> None:
        for tracker in self._trackers:
            tracker.hparams(hparams, metrics)

    def flush(self) -> None:
        for tracker in self._trackers:
            tracker.flush()

    def close(self) -> None:
        for tracker in self._trackers:
            tracker.close()


LAYOUT = {"podlaunch": {
    "loss": ["Multiline", ["^loss$"]],
    "own step time of each process (s)": ["Multiline", [r"^step_time_s/process_\d+$"]],
    "step time (s)": ["Multiline", ["^step_time_s$"]],
    "goodput": ["Multiline", ["^goodput/goodput$"]],
}}


def make_tracker(run_dir: str, process_id: int, enabled: bool):
    """Process 0: TensorBoard events and ``metrics.jsonl`` in ``<run_dir>/tensorboard``.

    Every other process, or logging.tensorboard off: a NullTracker.
    """
    if process_id == 0 and enabled:
        logdir = os.path.join(run_dir, "tensorboard")
        return Trackers(TensorBoardTracker(logdir, process_id=process_id),
                        JsonlTracker(os.path.join(logdir, METRICS_FILE)))
    return NullTracker()
