"""The input pipeline: each process streams its own rows of each step's global batch.

Which rows a step uses is ``worker.data.order`` (topology-free, optionally shuffled);
where they come from is ``worker.data.sources`` (memory-mapped files, checked rows).
``Batches`` reads this process's share of each call's batches on a background
thread, puts them on the local devices, and keeps at most ``prefetch`` calls
ready: the host-to-device copy of the next batch overlaps the current step, and
host and device memory hold a few batches, never the dataset.

A batch is a dict of named arrays, each ``[local_device_count,
per_device_batch_size, ...]`` (the ``pmap`` layout); for a fused call
(``train.steps_per_call`` k > 1) each is ``[local_device_count, W,
per_device_batch_size, ...]`` with a ``first`` index: step i of the call uses
window entry ``(first + i) % W``.

Threads, not processes: the work is numpy slicing and copies that release the
GIL, and worker processes forked after JAX has started (or sharing batches
through ``/dev/shm``) are what broke Grain-based loaders elsewhere
(docs/data.md).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable

import numpy as np

from worker.contract import sections
from worker.data.order import WEIGHT, Order, per_device_rows
from worker.data.sources import DataError, aligned_empty


def make_order(data: sections.Data, num_rows: int, global_batch_size: int) -> Order:
    """The job's ``Order`` over ``num_rows`` rows (``last_batch``, ``shuffle``, ``shuffle_seed``).

    Raises:
      DataError: a file too short for one global batch, which the launch checked was not: it
        was changed since (bad data in one line, not ``Order``'s ValueError and its traceback).
    """
    try:
        return Order(num_rows, global_batch_size, pad=data.last_batch == "pad",
                     shuffle=data.shuffle, seed=data.shuffle_seed)
    except ValueError as exc:
        if data.source == "synthetic":
            raise
        raise DataError(f"{data.path}: {exc}, though it could when the launch checked it: was "
                        "it changed, or still being written, since? copy it whole, then launch "
                        "again") from None


def is_resident(order: Order, resident: bool, prefetch: int, steps_per_call: int = 1) -> bool:
    """Whether ``Batches`` keeps every batch on the devices once placed: an unshuffled order
    whose batches all fit in the prefetch window (``prefetch`` batches, or a call's), or any
    unshuffled order with ``resident`` (``data.resident``)."""
    return not order.shuffle and (resident or order.num_batches <= max(prefetch, steps_per_call))


class Batches:
    """This process's batches, call by call, read ahead on a thread and placed on its devices.

    Args:
      source: a ``worker.data.sources`` source (``read(rows) -> {name: [n, ...]}``).
      order: the rows of every global batch.
      process_id, num_processes, local_device_count: this process and its devices.
      place: puts a dict of numpy arrays ``[local_device_count, ...]`` on the local devices.
      steps_per_call: k steps per device call.
      prefetch: calls read and placed ahead (>= 1).
      first_step, num_steps: 0-based first step, and the last step (exclusive).
      resident: keep every batch on the devices once placed (unshuffled orders only).

    When the job's devices do not divide the global batch, each device's rows are padded
    to the same count and every batch carries ``WEIGHT`` (1 a row, 0 padding).

    Raises (from ``get``):
      DataError: a bad value or a short file in the rows read, naming file, row, column.
    """

    def __init__(self, source, order: Order, process_id: int, num_processes: int,
                 local_device_count: int, place: Callable, steps_per_call: int = 1,
                 prefetch: int = 2, first_step: int = 0, num_steps: int = 0,
                 resident: bool = False):
        self.waited_s = 0.0  # seconds the loop waited in get for the reading thread
        self.source, self.order, self.place = source, order, place
        self.process_id, self.num_processes = process_id, num_processes
        self.local_device_count, self.k = local_device_count, steps_per_call
        # devices that do not divide the batch (a run shrunk onto fewer hosts): padded rows
        # of weight 0 under WEIGHT, and worker.trainer.train's weighted mean (worker.data.order)
        devices = num_processes * local_device_count
        self.weighted = order.global_batch_size % devices != 0
        self.per_device_batch_size = per_device_rows(order.global_batch_size, devices)
        # Unshuffled batches that all fit in the prefetch window are read and placed once
        # and reused every epoch: on-device as before, and still only a few batches. With
        # ``resident`` (data.resident) every batch is kept, whatever their number.
        self.resident = is_resident(order, resident, prefetch, steps_per_call)
        self._cache: dict = {}
        self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._thread = None
        generate = getattr(source, "generate", None)
        if generate is not None and num_steps > first_step:
            # generated data (synthetic) is made before step 1 for the rows of one epoch, as
            # loading did before streaming: making it is not reading, and would otherwise be
            # timed as the first steps' own time
            for step in range(first_step, min(num_steps, first_step + order.num_batches)):
                generate(self._rows(step)[0])
        if self.resident and num_steps > first_step:
            # placed before the first step, as all-in-memory loading did: reading them
            # later would be timed as the first steps' own time
            for b in range(order.num_batches if steps_per_call == 1 else 1):
                self.get(b * steps_per_call)
        if not self.resident and num_steps > first_step:
            self._thread = threading.Thread(
                target=self._produce, args=(first_step, num_steps), daemon=True,
                name="podlaunch-input")
            self._thread.start()

    def _host_batch(self, step: int) -> dict:
        """This process's rows of 0-based ``step``: ``{name: [local_device_count, per_device, ...]}``."""
        rows, weight = self._rows(step)
        batch = self.source.read(rows)
        if weight is not None:
            batch = {**batch, WEIGHT: weight}
        return {name: np.ascontiguousarray(a).reshape(
                    (self.local_device_count, self.per_device_batch_size) + a.shape[1:])
                for name, a in batch.items()}

    def _rows(self, step: int) -> tuple:
        """(rows, weight or None) of 0-based ``step`` for this process (``worker.data.order``)."""
        if self.weighted:
            return self.order.process_rows_weighted(step, self.process_id, self.num_processes,
                                                    self.local_device_count)
        return self.order.process_rows(step, self.process_id, self.num_processes), None

    def _window(self, steps) -> dict:
        batches = [self._host_batch(s) for s in steps]
        if self.k == 1:
            return batches[0]
        return {name: np.stack([b[name] for b in batches], axis=1, out=aligned_empty(
                    (self.local_device_count, len(batches)) + batches[0][name].shape[1:],
                    batches[0][name].dtype))
                for name in batches[0]}

    def _produce(self, first_step: int, num_steps: int) -> None:
        try:
            for start in range(first_step, num_steps, self.k):
                if self._stop.is_set():
                    return
                item = (start, self.place(self._window(range(start, start + self.k))))
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread
            self._queue.put((None, exc))

    def host_batch(self, step: int) -> dict:
        """0-based ``step``'s batch on the host (shapes and dtypes; the first batch's check)."""
        return self._host_batch(step)

    @property
    def same_every_call(self) -> bool:
        """Whether every call's inputs are the same arrays (resident data of one batch:
        ``get`` returns one tuple whatever the step), so a loop may take them once."""
        return self.resident and self.order.num_batches == 1

    def get(self, start: int) -> tuple:
        """The inputs of the call whose first step (0-based) is ``start``.

        Returns:
          ``(batch,)`` for k = 1, else ``(window, first)`` with ``first``
          ``[local_device_count]`` int32 on the devices.
        """
        if self.resident:
            b = start % self.order.num_batches
            if self.k == 1:
                if b not in self._cache:
                    self._cache[b] = self.place(self._host_batch(b))
                return (self._cache[b],)
            if "window" not in self._cache:
                self._cache["window"] = self.place(self._window(range(self.order.num_batches)))
            return self._cache["window"], self._first(b)
        waiting = time.perf_counter()
        got, item = self._queue.get()
        self.waited_s += time.perf_counter() - waiting
        if got is None:
            raise item
        if got != start:
            raise RuntimeError(f"input pipeline out of order: call at step {start + 1} got "
                               f"the batches of step {got + 1}")
        return (item,) if self.k == 1 else (item, self._first(0))

    def _first(self, b: int):
        key = ("first", b)
        if key not in self._cache:
            self._cache[key] = self.place(np.full((self.local_device_count,), b, np.int32))
        return self._cache[key]

    def close(self) -> None:
        """Stop the reading thread (it may be blocked on a full queue)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
