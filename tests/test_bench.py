"""What the benchmarks compute, on this machine with no chip (issue 71: ``honest_ratio``, which
every benchmark's ratio to the step's limit goes through, was tested only by bench/tpu_check.py
on a TPU; a division the wrong way round passed every test the CI runs)."""

from __future__ import annotations

import os
import sys

import pytest

from harness.helpers import REPO

sys.path.insert(0, os.path.join(REPO, "bench"))
import step_limit  # noqa: E402  (bench/step_limit.py: the benchmarks import it beside them)


def test_honest_ratio_is_the_launch_over_its_limit_and_refuses_a_launch_that_beats_it():
    assert step_limit.honest_ratio(600.0, 1000.0, "256x4 k=1") == pytest.approx(0.6)
    assert step_limit.honest_ratio(1040.0, 1000.0, "256x4 k=1") == pytest.approx(1.04)  # in the slack
    with pytest.raises(SystemExit) as refused:  # beyond it: the limit is wrong, not the launch fast
        step_limit.honest_ratio(1200.0, 1000.0, "256x4 k=100")
    said = str(refused.value)
    assert said.startswith("256x4 k=100: launch 1,200 steps/s beats its limit 1,000 by 20%")
    assert "FORMS" in said
