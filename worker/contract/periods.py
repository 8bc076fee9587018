"""When the training loop's periodic work falls, declared once by the settings that give it.

A step setting that names a period (every N steps, the last step) says with it what that
period asks of the device calls (``setting(..., period=...)`` in ``worker.contract.sections``):

* ``ENDS_A_CALL``: a call ends at each multiple, because the work needs the state after that
  step (a save, the run's last step). ``train.steps_per_call`` must divide it: the launcher
  refuses a number that does not (``launcher.spec.crosschecks``), and ``auto`` picks a
  divisor of all of them (``worker.trainer.calls.steps_per_call``).
* ``A_ROW``: the call returns a row of metrics for each multiple, which may fall inside a
  call (a log step): the rows come every gcd of k and the periods
  (``worker.trainer.calls.metrics_every``).
* ``NEXT_CALL_END``: the work is done at the first call end at or after each multiple (a
  local copy): nothing asked of k.

So an action with a period (an evaluation every N steps, say) is its setting, with its
``period``, and its action (``worker.trainer.actions``); steps per call and the launcher's
check follow from the declaration. Standard library only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

ENDS_A_CALL = "ends a call"
A_ROW = "a row of a call"
NEXT_CALL_END = "at the next call end"
KINDS = (ENDS_A_CALL, A_ROW, NEXT_CALL_END)


def of(job: Any, kind: str) -> list[tuple[tuple[str, str], int]]:
    """``((section, key), steps)`` of every setting of ``job`` whose period is ``kind``, in
    declaration order, where it is on (an int > 0; 0 means never).

    Args:
      job: a dataclass whose fields include sections (``worker.contract.job.WorkerJob``, the
        launcher's ``JobSpec``); fields that are not dataclasses, or are None, are skipped.
      kind: one of ``KINDS``.

    Raises:
      ValueError: ``kind`` is not one of ``KINDS``.
    """
    if kind not in KINDS:
        raise ValueError(f"expected one of {KINDS}, got {kind!r}")
    found = []
    for field in dataclasses.fields(job):
        section = getattr(job, field.name, None)
        if section is None or not dataclasses.is_dataclass(section):
            continue
        for setting in dataclasses.fields(section):
            value = getattr(section, setting.name)
            if setting.metadata.get("period") == kind and isinstance(value, int) \
                    and not isinstance(value, bool) and value > 0:
                found.append(((field.name, setting.name), value))
    return found


def steps(job: Any, kind: str) -> list[int]:
    """The step counts of ``of(job, kind)``."""
    return [value for _, value in of(job, kind)]
