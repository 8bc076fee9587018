"""Every process's own step times, to process 0, without a device collective.

Each process posts the values of its log steps, a batch at a time, to the
key-value store of JAX's coordination service (the service
``jax.distributed.initialize`` starts in process 0; JAX's own compilation
cache and ``array_serialization`` exchange keys through the same client).
Process 0 reads every process's recent batches with one ``key_value_dir_get``
and writes a log step once every process's value for it has arrived.

Why not ``multihost_utils.process_allgather`` at each log step: a collective
on the devices queues behind the steps in flight, so the host waits for them
and dispatches the next step late. Measured on the 65,536 x 256 benchmark
(``bench/bench_logging.py``, docs/monitoring.md), one per step cost 15% of the
steps/s, and one key-value post per step still cost 2.4 ms of CPU per step
(gRPC threads on both ends): hence batches, one post per process per batch.

Keys: ``podlaunch/own_step_time_s/<process_id>/<seq mod SLOTS>``, overwritten
in turn, so the store holds at most ``SLOTS`` batches per process and nothing
needs deleting (a delete per batch would be one more RPC per process for the
coordinator, which runs inside process 0). A value is
``"<seq> <step>:<value>;<step>:<value>..."``; slots already read are skipped
by their ``seq`` before their entries are parsed. Process 0 reads the store
at least as often as any process posts (every ``read_every_s`` while it has
records waiting; all processes advance in lockstep and post on the same
period), so a batch overwritten unread means a process far ahead of process
0, which the collectives of the training step do not allow; if it ever
happens the lost values are written as NaN and ``lost_batches`` counts them
(``worker.telemetry.metrics`` prints a warning). The store lives as long as the
coordinator (one attempt of a run), so keys never meet those of another
attempt.

Cost: process 0 reads ``num_processes x SLOTS`` values per read, each
``read_every_s`` of log steps (about 15 bytes per log step), so with 256
processes logging every fast step (75 steps per batch) a read moves about
1 MB; with the default ``log_every_steps: 10`` a tenth of that.

Source of the store's semantics (set with overwrite, directory get, blocking
behaviour): the coordination service of XLA/TSL
(``xla/tsl/distributed_runtime/coordination/coordination_service.h``), reached
through ``jax._src.distributed.global_state.client`` (a
``DistributedRuntimeClient``), present from jax 0.4 to 0.10.
"""

from __future__ import annotations

import time

PREFIX = "podlaunch/own_step_time_s/"
SLOTS = 4


def coordination_client():
    """The ``DistributedRuntimeClient`` of this process (after ``jax.distributed.initialize``).

    Raises:
      RuntimeError: JAX's distributed runtime is not initialized.
    """
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed.initialize has not run: no coordination service client")
    return client


def encode(seq: int, entries) -> str:
    """``(seq, [(step, value), ...])`` -> the stored text (``repr`` keeps every float exactly)."""
    return f"{seq} " + ";".join(f"{step}:{value!r}" for step, value in entries)


def decode(text: str) -> tuple[int, list]:
    """The stored text -> ``(seq, [(step, value), ...])``."""
    seq_text, _, body = text.partition(" ")
    entries = []
    for item in filter(None, body.split(";")):
        step_text, _, value_text = item.partition(":")
        entries.append((int(step_text), float(value_text)))
    return int(seq_text), entries


class KeyValueGather:
    """Posts this process's values in batches; process 0 collects everyone's per step.

    Args:
      process_id, num_processes: this process's identity.
      client: a ``DistributedRuntimeClient`` (default: ``coordination_client()``).
    """

    def __init__(self, process_id: int, num_processes: int, client=None):
        self.process_id, self.num_processes = process_id, num_processes
        self.client = client if client is not None else coordination_client()
        self.lost_batches = 0
        self._seq = 0
        self._next_seq = [0] * num_processes        # process 0: next batch expected per process
        self._last_step = [0] * num_processes       # process 0: newest step seen per process
        self._values: dict[int, dict[int, float]] = {}  # process 0: step -> {process_id: value}

    def post(self, entries) -> None:
        """Offer ``[(step, value_s), ...]`` (one batch of log steps). Never waits for others."""
        entries = list(entries)
        if not entries:
            return
        if self.process_id == 0:
            for step, value in entries:
                self._values.setdefault(step, {})[0] = float(value)
                self._last_step[0] = max(self._last_step[0], step)
            return
        key = f"{PREFIX}{self.process_id}/{self._seq % SLOTS}"
        self.client.key_value_set(key, encode(self._seq, entries), allow_overwrite=True)
        self._seq += 1

    def collect(self, steps) -> dict:
        """Process 0: the steps among ``steps`` whose values have all arrived. No waiting.

        Returns:
          ``{step: [num_processes] list of float seconds, indexed by process_id}``;
          NaN for a value that was lost (see the module).
        """
        steps = list(steps)
        done = self._complete_steps(steps)
        if len(done) == len(steps):
            return done
        batches: dict[int, list] = {}
        for key, text in self.client.key_value_dir_get(PREFIX):
            process_id = int(key[len(PREFIX):].split("/")[0])
            batches.setdefault(process_id, []).append((int(text.partition(" ")[0]), text))
        for process_id, found in batches.items():
            for seq, text in sorted(found):
                if seq < self._next_seq[process_id]:
                    continue  # read before
                self.lost_batches += seq - self._next_seq[process_id]
                self._next_seq[process_id] = seq + 1
                for step, value in decode(text)[1]:
                    self._values.setdefault(step, {})[process_id] = value
                    self._last_step[process_id] = max(self._last_step[process_id], step)
        done.update(self._complete_steps([step for step in steps if step not in done]))
        return done

    def _complete_steps(self, steps) -> dict:
        # Every process posts its log steps in step order, so a value missing
        # for a step older than one the process has posted since was lost
        # (an overwritten slot): it will never come, and is NaN.
        done = {}
        for step in steps:
            values = self._values.get(step, {})
            if all(p in values or self._last_step[p] > step for p in range(self.num_processes)):
                self._values.pop(step, None)
                done[step] = [values.get(p, float("nan")) for p in range(self.num_processes)]
        return done

    def wait(self, steps, timeout_s: float, poll_s: float = 0.01) -> dict:
        """Process 0: every process's values for ``steps``, polling for up to ``timeout_s``.

        ``timeout_s=0`` reads once: what has arrived, without waiting.

        Returns:
          ``{step: [num_processes] list}`` for every step in ``steps``; NaN for a
          process whose value did not arrive in time (it has stopped, and the
          launcher reports it).
        """
        pending, done = list(steps), {}
        deadline = time.monotonic() + timeout_s
        while pending:
            try:
                done.update(self.collect(pending))
            except Exception:  # noqa: BLE001 - the coordinator is gone (a peer failed): no more values
                break
            pending = [step for step in pending if step not in done]
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(poll_s)
        for step in pending:
            values = self._values.pop(step, {})
            done[step] = [values.get(p, float("nan")) for p in range(self.num_processes)]
        return done
