"""Metrics sinks: TensorBoard (process 0) or nothing (everyone else).

Callers never branch on "am I process 0": they get a ``Tracker`` either way,
as levanter's trackers do.
"""

from __future__ import annotations

import os


class NullTracker:
    """Accepts everything and writes nothing (processes other than 0, or logging off)."""

    def scalars(self, step: int, values: dict) -> None:
        pass

    def text(self, tag: str, text: str, step: int = 0) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardTracker(NullTracker):
    """Writes TensorBoard event files with tensorboardX.

    Every call flushes, so a run killed mid-way keeps everything logged so far;
    calls come only every ``log_every_steps``, so flushing costs nothing per step.
    """

    def __init__(self, logdir: str):
        from tensorboardX import SummaryWriter  # only process 0 pays for the import

        os.makedirs(logdir, exist_ok=True)
        self._writer = SummaryWriter(logdir=logdir, flush_secs=5)

    def scalars(self, step: int, values: dict) -> None:
        for tag, value in values.items():
            self._writer.add_scalar(tag, float(value), global_step=step)
        self._writer.flush()

    def text(self, tag: str, text: str, step: int = 0) -> None:
        self._writer.add_text(tag, text, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def make_tracker(run_dir: str, process_id: int, enabled: bool):
    """A TensorBoardTracker in ``<run_dir>/tensorboard`` for process 0, else a NullTracker."""
    if process_id == 0 and enabled:
        return TensorBoardTracker(os.path.join(run_dir, "tensorboard"))
    return NullTracker()
