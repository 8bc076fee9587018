"""The built-in tasks' names and the arguments each takes, for checking ``task`` before anything
starts (the functions themselves are ``worker.tasks.BUILTIN``: they import jax, this does not;
``tests/worker/contract/test_contract.py`` holds the two to each other).
"""

from __future__ import annotations

import math
from typing import Any

# The built-in tasks (worker.tasks.BUILTIN) and the arguments each takes: name -> {argument:
# (required, what it takes)}; task.args is checked against them before anything starts, and a
# test holds them to the functions' signatures
BUILTIN_TASK_ARGS = {
    "linear_regression": {},
    "softmax_classifier": {"num_classes": (True, "an integer >= 2"),
                           "input_scale": (False, "a number")},
}
BUILTIN_TASKS = tuple(BUILTIN_TASK_ARGS)


def task_arg_problem(expected: str, value: Any) -> str | None:
    """Why ``value`` is not what a built-in task's argument takes (``expected``, from
    ``BUILTIN_TASK_ARGS``), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected {expected}, got {value!r}"
    if expected.startswith("an integer") and (not isinstance(value, int) or value < 2):
        return f"expected {expected}, got {value!r}"
    if not math.isfinite(value):
        return f"expected a finite number, got {value!r}"
    return None
