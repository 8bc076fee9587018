"""The goodput ledger in TensorBoard: an event file of the launcher's (``*.goodput``) in the
job's own run (``<run>/tensorboard``), so TensorBoard lists one run, not a second one for the
ledger; its scalars are the run's ``goodput/goodput`` so far and each bucket's seconds
(``goodput/<bucket>_s``, ``launcher.rundir.ledger.BUCKETS``) at each attempt's furthest step.
"""

from __future__ import annotations

from launcher.rundir.ledger import totals


def write_scalars(logdir: str, entries: list, new: int) -> None:
    """TensorBoard scalars of the run's ledger in ``logdir`` (``<run>/tensorboard``: an event
    file of its own, ``*.goodput``, in the job's run, so TensorBoard lists one run, not a
    second one for the ledger): for each of the last ``new`` entries, at its furthest step,
    the run's ``goodput/goodput`` so far and ``goodput/<bucket>_s``.

    Raises:
      OSError: the event file could not be written.
    """
    from worker.telemetry.tracker import tensorboardx

    SummaryWriter = tensorboardx().SummaryWriter  # the launcher pays for it at the end only

    writer = SummaryWriter(logdir=logdir, flush_secs=1, filename_suffix=".goodput")
    try:
        for i in range(len(entries) - new, len(entries)):
            run = totals(entries[:i + 1])
            step = entries[i].get("reached_step") or 0
            if run["goodput"] is not None:
                writer.add_scalar("goodput/goodput", run["goodput"], step)
            for name, seconds in run["buckets_s"].items():
                writer.add_scalar(f"goodput/{name}_s", seconds, step)
    finally:
        try:
            writer.close()
        except OSError:  # a full disk: tensorboardX's writer thread and its atexit hook
            for file_writer in (getattr(writer, "all_writers", None) or {}).values():
                _abandon(file_writer.event_writer)  # would raise again at exit, a traceback
            raise


def _abandon(event_writer) -> None:
    """Stop a tensorboardX event writer whose file cannot be written (a full disk): its thread
    ends, its file is closed, and its atexit hook finds it closed. Best effort."""
    for stop in (lambda: event_writer._worker.stop(), lambda: event_writer._ev_writer.close()):
        try:
            stop()
        except Exception:  # noqa: BLE001 - the disk is full: nothing more to save
            pass
    event_writer._closed = True
