"""Where a log step's scalars go: TensorBoard and metrics.jsonl, in step order, each record
whole (``worker.telemetry.metrics`` reads them; this module writes them).

With one process, or TensorBoard off, every record is written as it is read, with this
process's own step time. With several processes each one posts its own step times to
process 0 (``worker.runtime.gather``, the coordination service's key-value store), and process 0
holds each record until every process's value for that step has arrived (or, at the end,
until a wait runs out: a value that never came is NaN), so a record is written once, whole.
"""

from __future__ import annotations

import collections
import itertools
import time
from typing import Callable

from worker.contract import metrics
from worker.runtime import interrupts


def process_tag(process_id: int) -> str:
    """A record's key of one process's own step time: ``step_time_s/process_NNN``
    (``worker.contract.metrics.PROCESS_STEP_TIME``)."""
    return f"{metrics.PROCESS_STEP_TIME}{process_id:03d}"


class Records:
    """Args:
      tracker: a ``worker.telemetry.tracker`` tracker (real on process 0, no-op elsewhere).
      gather: a ``worker.runtime.gather.KeyValueGather``-like object, or None (one process).
      process_id, num_processes: this process's identity.
      num_steps: the last step (its record also writes the hparams' final_loss).
      hparams: flat hparams, written with the last step's record.
      out: prints a warning (lost batches of other processes' values).
      clock: seconds, monotonic.
    """

    def __init__(self, tracker, gather, process_id: int, num_processes: int, num_steps: int,
                 hparams: dict, out=print, clock: Callable[[], float] = time.perf_counter):
        self.tracker, self.gather, self.out, self.clock = tracker, gather, out, clock
        self.process_id, self.num_processes = process_id, num_processes
        self.num_steps, self.hparams = num_steps, hparams
        self.held: collections.deque = collections.deque()  # process 0: (step, values) to write
        self.last_collect = -float("inf")
        self._warned_lost = 0

    def add(self, records: list, post: bool = True) -> None:
        """``(step, own_step_time_s, values)`` of this process's log steps, in step order:
        written now (one process), or posted and, on process 0, held until complete.
        ``post`` False: nothing is sent (a process ending while process 0 may be gone)."""
        if self.gather is None:
            tag = process_tag(self.process_id)
            for _, own, values in records:
                values[tag] = own
            self._write_rows([(step, values) for step, _, values in records])
            self.tracker.flush()
        elif post:
            self.gather.post((step, own) for step, own, _ in records)
            if self.process_id == 0:
                self.held.extend((step, values) for step, _, values in records)
                self.collect()

    def collect(self) -> None:
        """Process 0: read the other processes' posted values; write the records now complete."""
        self._write_held(self.gather.collect(step for step, _ in self.held))
        self.last_collect = self.clock()
        lost = self.gather.lost_batches
        if lost > self._warned_lost:
            self._warned_lost = lost
            self.out(f"warning: {lost} batch{'' if lost == 1 else 'es'} of other processes' step "
                     "times were overwritten "
                     "before process 0 read them; their per-process values are NaN")

    def drain(self, timeout_s: float, ending: bool = False) -> None:
        """Write every held record, waiting up to ``timeout_s`` for the missing values.

        ``ending`` (a process on its way out): if process 0's store is gone too, the held
        records are written without the other processes' values rather than lost.
        """
        if not self.held:
            return
        try:
            self._write_held(self.gather.wait([step for step, _ in self.held], timeout_s=timeout_s))
        except Exception:  # noqa: BLE001 - the coordination service is gone with its processes
            if not ending:
                raise
        with interrupts.held():
            rows = list(self.held)
            self._write_rows(rows)  # raises: every record still held, none lost
            self.held.clear()
            self.tracker.flush()

    def _write_held(self, arrived: dict) -> None:
        """Write held records in step order while their per-process values have arrived."""
        # taken off held once written: a write that raises loses none (the writer thread's
        # error is raised before it takes the batch; a tracker in this thread may have
        # written part of it, written again by the next try)
        with interrupts.held():
            rows = []
            for step, values in itertools.takewhile(lambda record: record[0] in arrived, self.held):
                values.update(zip(map(process_tag, range(self.num_processes)), arrived.get(step, ())))
                rows.append((step, values))
            self._write_rows(rows)
            for _ in rows:
                self.held.popleft()
            self.tracker.flush()

    def _write_rows(self, rows: list) -> None:
        """``(step, values)`` records, in step order, to the tracker in one batch (two where the
        last step's record is not the batch's last: a program may report past it), the
        hparams right after the last step's scalars."""
        last = next((index for index, (step, values) in enumerate(rows)
                     if step == self.num_steps and "loss" in values), None)
        if last is not None:
            self.tracker.rows(rows[:last + 1])
            self.tracker.hparams(self.hparams, {"final_loss": rows[last][1]["loss"]})
            rows = rows[last + 1:]
        if rows:
            self.tracker.rows(rows)
