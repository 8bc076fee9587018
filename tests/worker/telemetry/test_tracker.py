"""Process 0's metrics files, written by the tracker's fast paths, read back with the readers
users have: TensorBoard's own event reader and ``json``."""

from __future__ import annotations

import json
import math
import os
import struct

import numpy as np
import pytest

from tests.harness import helpers
from worker.telemetry import tracker as trackers
from worker.telemetry.records import Records


def test_events_built_once_per_set_of_tags_read_back_as_written(tmp_path):
    # three sets of tags (a program's extra scalar at some steps), the own step time to its
    # run, a value that changes at every step: a reused event must carry this step's values
    logdir = str(tmp_path / "tb")
    tb = trackers.TensorBoardTracker(logdir)
    written: dict = {}
    for step in range(1, 41):
        values = {"loss": 1.0 / step, "grad_norm": np.float32(step), "step_time_s": 1e-6 * step,
                  "step_time_s/process_000": 2e-6 * step}
        if step % 3 == 0:
            values["accuracy"] = step / 100
        if step % 10 == 0:
            values = {"loss": -float(step)}  # another set again
        tb.scalars(step, values)
        for tag, value in values.items():
            written.setdefault(tag, []).append((step, float(np.float32(value))))
    tb.close()
    scalars = helpers.read_scalars(logdir)
    own = written.pop("step_time_s/process_000")
    assert scalars == written
    assert helpers.read_own_step_times(logdir) == {0: own}


def test_event_records_framed_as_tensorboardx_frames_them(tmp_path):
    # the framing (length, masked CRC-32C of it, data, masked CRC-32C of the data) byte for byte
    # as tensorboardX's RecordWriter writes the same serialized events
    from tensorboardX.record_writer import RecordWriter

    logdir = str(tmp_path / "tb")
    tb = trackers.TensorBoardTracker(logdir)
    payloads = []
    for step in range(5):
        tb.scalars(step, {"loss": 0.5 ** step, "step_time_s": 1e-3})
        payloads.append(tb._shape(("loss", "step_time_s"))[1].SerializeToString())
    tb.close()
    (path,) = [os.path.join(logdir, name) for name in os.listdir(logdir) if "tfevents" in name]
    ours = open(path, "rb").read()
    reference = RecordWriter(str(tmp_path / "reference"))
    for payload in payloads:
        reference.write(payload)
    reference.close()
    theirs = open(tmp_path / "reference", "rb").read()
    assert ours.endswith(theirs) and len(theirs) > 5 * 12
    # and each record checks by the format's own rule
    offset, records = 0, 0
    while offset < len(ours):
        (length,) = struct.unpack_from("<Q", ours, offset)
        data = ours[offset + 12:offset + 12 + length]
        (crc,) = struct.unpack_from("<I", ours, offset + 12 + length)
        assert crc == trackers._masked(trackers.tensorboardx().crc32c.crc32c(data))
        offset, records = offset + 16 + length, records + 1
    assert offset == len(ours) and records >= 6  # the file's version event, the layout, 5 steps


def test_metrics_lines_are_what_json_dumps_writes(tmp_path):
    # the lines built from cached keys equal json.dumps of the record, numbers and nulls alike
    path = str(tmp_path / "metrics.jsonl")
    rows = [(1, {"loss": 0.1, "grad_norm": np.float32(0.2), "step_time_s": 1e-7}),
            (2, {"loss": float("nan"), "grad_norm": float("inf"), "step_time_s": -0.0}),
            (3, {"loss": 1e300, "weird \"tag\"\n": 3, "step_time_s": 123456789.125}),
            (4, {"loss": -float("inf"), "grad_norm": np.float64(1 / 3), "step_time_s": 2.5e-5})]
    jsonl = trackers.JsonlTracker(path)
    for step, values in rows:
        jsonl.scalars(step, values)
    jsonl.close()
    expected = [json.dumps({"step": step, **{tag: (float(v) if math.isfinite(float(v)) else None)
                                             for tag, v in values.items()}})
                for step, values in rows]
    assert open(path).read().splitlines() == expected
    assert [json.loads(line)["step"] for line in expected] == [1, 2, 3, 4]


class Arrived:
    """Every process's step times arrived for every step (process 0 of 2's gather)."""

    lost_batches = 0

    def post(self, items):
        list(items)

    def collect(self, steps):
        return {step: (0.1, 0.2) for step in steps}

    def wait(self, steps, timeout_s):
        return self.collect(steps)


class Written(trackers.NullTracker):
    """What reached the writer, in order; fails once at ``fail_at``'s step."""

    def __init__(self, fail_at=None):
        self.calls, self.fail_at = [], fail_at

    def scalars(self, step, values):
        if step == self.fail_at:
            self.fail_at = None
            raise OSError(28, "No space left on device")
        self.calls.append(("scalars", step))

    def hparams(self, hparams, metrics):
        self.calls.append(("hparams", metrics["final_loss"]))


def test_held_records_in_one_batch_keep_the_hparams_after_the_last_steps_scalars():
    # process 0 of 2, the last step's record and one past it (a program reporting on)
    # complete at one collect: the hparams come right after the last step's scalars
    written = Written()
    records = Records(written, Arrived(), 0, 2, 10, {"lr": 1})
    records.add([(9, 0.1, {"loss": 0.6}), (10, 0.1, {"loss": 0.5}), (11, 0.1, {"loss": 0.4})])
    assert written.calls == [("scalars", 9), ("scalars", 10), ("hparams", 0.5), ("scalars", 11)]


def test_a_write_error_loses_no_held_record_through_the_writer_thread():
    # the writer thread met a full disk on an earlier call: the loop's next hand-over raises
    # it, and the batch it was handing over stays held, written whole at the end's drain
    inner = Written(fail_at=0)
    tracker = trackers.BackgroundTracker(inner)
    records = Records(tracker, Arrived(), 0, 2, 10, {})
    tracker.scalars(0, {"loss": 1.0})
    tracker._calls.join()  # the writer has met its error
    records.held.extend((step, {"loss": 1.0}) for step in (1, 2, 3))
    with pytest.raises(OSError):
        records.collect()
    assert [step for step, _ in records.held] == [1, 2, 3]
    records.drain(0.0, ending=True)
    tracker.close()
    assert [step for kind, step in inner.calls if kind == "scalars"] == [1, 2, 3]
