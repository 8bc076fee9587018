"""Allocations sized by the input are bounded or checked before launch (issue 25, item 6)."""

from __future__ import annotations

import os
import resource

import numpy as np
import pytest

from harness.helpers import REPO, launch
from launcher import backends
from launcher.spec import checks
from launcher import spec as specs
from launcher.errors import SpecError
from worker.data import sources


def test_a_synthetic_chunk_is_bounded_in_bytes_however_wide_its_rows():
    assert sources.chunk_rows(4, 1) == sources.SYNTHETIC_CHUNK_ROWS  # the usual case unchanged
    wide = sources.chunk_rows(2_000_000, 1)
    assert wide * (2_000_000 + 1) * 4 <= sources.SYNTHETIC_CHUNK_BYTES and wide >= 1
    x, y = sources.synthetic_chunk(0, 2_000_000, 1, 0.1, 0)
    assert x.shape == (wide, 2_000_000) and y.shape == (wide, 1)
    # rows are the same read through chunks or as one range
    rows_x, _ = sources.synthetic_rows(0, 2_000_000, 1, 0.1, 1, 3)
    np.testing.assert_array_equal(rows_x[0], x[1])


@pytest.mark.slow
def test_eight_examples_of_two_million_features_train_without_a_huge_allocation(tmp_path):
    # once 30.5 GiB per process (a 4,096-row chunk); now a few chunks of 16 MiB
    result = launch("jobs/linear.yaml", "--set", "data.in_features=2000000",
                    "--set", "data.num_examples=8", "--set", "train.global_batch_size=8",
                    "--set", "train.num_steps=3", "--set", "cluster.devices_per_process=1",
                    "--set", "logging.tensorboard=false", "--set", "checkpoint.every_steps=0",
                    "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "OK: 2 processes succeeded" in result.stdout
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kib < 4 << 20, f"a process peaked at {peak_kib / (1 << 20):.1f} GiB"


def test_a_model_too_big_for_this_machine_is_refused_before_launch():
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), None,
                     ("data.in_features=100000", "data.out_features=100000"), registry=backends)
    with pytest.raises(SpecError) as err:
        checks.check_fits_in_memory(job, memory_bytes=64 << 30)
    said = str(err.value.problems[0])
    assert "data.in_features: a linear_regression model of 100000 x 100000 float32 weights " \
           "needs about" in said and "more than 80% of this machine's 64.0 GiB" in said, said
    result = launch("jobs/linear.yaml", "--set", "data.in_features=1000000",
                    "--set", "data.out_features=100000", "--dry-run")
    assert result.returncode == 2 and "data.in_features: a linear_regression model" in result.stderr
    checks.check_fits_in_memory(specs.load(os.path.join(REPO, "jobs/linear.yaml"),
                                           registry=backends), 64 << 30)
