"""CPU time per log step's TensorBoard event: podlaunch's tracker against tensorboardX's
``SummaryWriter``, in the same run.

Process 0 writes one event per log step (every scalar of the step in one ``Summary``). At a
few thousand log steps a second (a tiny model fused 1,000 steps a call on a TPU, a log step
every 100) that work shares one interpreter lock with the loop that dispatches to the chip,
so what counts is all the CPU time it takes, on every thread, not only the caller's.

* ``summarywriter``: ``SummaryWriter(...)._get_file_writer().add_summary(summary, step)``, the
  reference (what the tracker did before: every event through tensorboardX's
  ``multiprocessing.Queue`` and its writer thread), then ``flush``.
* ``tracker``: ``worker.telemetry.tracker.TensorBoardTracker.scalars``, then ``flush``.

Then the calling thread's share alone where a ``BackgroundTracker`` writes on a thread of its
own (the worker's loop): log steps handed over one by one (``scalars``) against in batches of
``BATCH`` (``rows``, what a read of log steps hands over).

Prints, per side, microseconds per event of this thread's CPU time (``time.thread_time``) and of
the whole process's (``time.process_time``: every thread), the best of ``--rounds``, and the
ratios tracker / summarywriter. CPU time, not wall time: other load on a shared machine
hardly moves it.

    python bench/bench_tracker.py --events 20000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from worker.telemetry import tracker as trackers  # noqa: E402  (after the path is set)

VALUES = {"loss": 0.1, "grad_norm": 0.2, "param_norm": 1.0, "learning_rate": 0.1,
          "step_time_s": 1e-6, "examples_per_s": 1e8, "step_time_s/process_000": 1e-7}
BATCH = 250  # log steps a read hands over at the default on a TPU v5e (25 ms of them)


def summarywriter(logdir: str, events: int) -> None:
    SummaryWriter = trackers.tensorboardx().SummaryWriter
    from tensorboardX.proto.summary_pb2 import Summary

    writer = SummaryWriter(logdir=logdir, flush_secs=2, max_queue=1024)
    file_writer = writer._get_file_writer()
    for step in range(events):
        file_writer.add_summary(Summary(value=[Summary.Value(tag=tag, simple_value=float(v))
                                               for tag, v in VALUES.items()]), global_step=step)
    writer.close()  # every event written: the writer thread's share counted


def tracker(logdir: str, events: int) -> None:
    tb = trackers.TensorBoardTracker(logdir)
    for step in range(events):
        tb.scalars(step, VALUES)
    tb.close()


def handed_each(logdir: str, events: int) -> None:
    # the loop's thread handing each log step to the writer thread (BackgroundTracker.scalars)
    tb = trackers.BackgroundTracker(trackers.TensorBoardTracker(logdir))
    for step in range(events):
        tb.scalars(step, VALUES)
    tb.close()


def handed_batches(logdir: str, events: int) -> None:
    # the same log steps handed over 250 at a time (BackgroundTracker.rows: one read's batch)
    tb = trackers.BackgroundTracker(trackers.TensorBoardTracker(logdir))
    for first in range(0, events, BATCH):
        tb.rows([(step, VALUES) for step in range(first, min(events, first + BATCH))])
    tb.close()


def caller_share(side, events: int) -> float:
    """Microseconds per event of the calling thread's CPU alone (the writer thread's not)."""
    with tempfile.TemporaryDirectory() as logdir:
        thread = time.thread_time()
        side(logdir, events)
        return (time.thread_time() - thread) / events * 1e6


def measure(side, events: int) -> tuple:
    with tempfile.TemporaryDirectory() as logdir:
        thread, process = time.thread_time(), time.process_time()
        side(logdir, events)
        return ((time.thread_time() - thread) / events * 1e6,
                (time.process_time() - process) / events * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sides = {"summarywriter": summarywriter, "tracker": tracker}
    best = {name: (float("inf"), float("inf")) for name in sides}
    for _ in range(args.rounds):
        for name, side in sides.items():
            thread_us, process_us = measure(side, args.events)
            best[name] = (min(best[name][0], thread_us), min(best[name][1], process_us))
    for name, (thread_us, process_us) in best.items():
        print(f"{name:14s} {thread_us:7.1f} us/event this thread, {process_us:7.1f} every thread")
    ref, new = best["summarywriter"], best["tracker"]
    print(f"tracker / summarywriter: {new[0] / ref[0]:.2f} this thread, "
          f"{new[1] / ref[1]:.2f} every thread ({args.events} events, best of {args.rounds})")
    # the loop's thread's share when the writing is on a thread of its own: a log step handed
    # over alone, against a batch of them (the calling thread's CPU only; the close's wait
    # for the writer is a sleep, not CPU)
    each = min(caller_share(handed_each, args.events) for _ in range(args.rounds))
    batches = min(caller_share(handed_batches, args.events) for _ in range(args.rounds))
    print(f"handed to the writer thread: {each:.1f} us/event one by one, {batches:.1f} in "
          f"batches of {BATCH} ({batches / each:.2f}), the calling thread's CPU")


if __name__ == "__main__":
    main()
