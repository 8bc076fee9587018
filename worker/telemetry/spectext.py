"""The run's spec as TensorBoard shows it: its text tab (``spec_markdown``) and its hparams
(``flatten``), secrets masked (``worker.contract.redact``). Standard library only."""

from __future__ import annotations

import json
from typing import Any

from worker.contract import job as jobs
from worker.contract import redact


def flatten(tree: Any, prefix: str = "") -> dict:
    """Nested dicts/lists -> ``{"a.b.0": value}`` with values TensorBoard's hparams accept.

    Returns:
      A flat dict of bool, int, float or str (None and anything else become strings).
    """
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return {prefix: tree if isinstance(tree, (bool, int, float, str)) else str(tree)}
    out: dict = {}
    for key, value in items:
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def spec_markdown(job: jobs.WorkerJob) -> str:
    """The worker's job, secrets masked, as an indented (preformatted) Markdown block for
    TensorBoard's text tab."""
    text = json.dumps(redact.masked(job.to_dict(), job.secrets), indent=2, sort_keys=False,
                      default=str)
    return "\n".join("    " + line for line in text.splitlines())
