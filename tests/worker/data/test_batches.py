"""Several batches per epoch, several epochs, a last partial batch dropped or padded.

Real workers (2 processes x 1 CPU device) train on a .csv file whose target is
not the last column; the reference is numpy SGD walking the same global
batches in the same order (batch s-1 mod num_batches at step s), so batch
selection and cycling are checked, not only a full-batch mean.
"""

from __future__ import annotations

import os
import re
import textwrap

import numpy as np
import pytest

from harness.helpers import launch, launched

pytestmark = pytest.mark.slow

ROWS, FEATURES, BATCH, STEPS, LR = 12, 3, 8, 7, 0.05


def _data(tmp_path):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((ROWS, FEATURES))
    y = x @ np.array([1.5, -2.0, 0.5]) + 0.3 + 0.01 * rng.standard_normal(ROWS)
    table = np.column_stack([x[:, 0], y, x[:, 1:]])  # the target is column 1
    path = tmp_path / "data.csv"
    np.savetxt(path, table, delimiter=",", header="a,target,b,c", comments="", fmt="%.17g")
    return x, y


def _reference(x, y, batches):
    import jax

    from worker.tasks import init_linear

    w, b = (np.asarray(a, np.float64) for a in init_linear(jax.random.PRNGKey(0), FEATURES, 1))
    for step in range(1, STEPS + 1):
        rows = batches[(step - 1) % len(batches)]
        xb, yb = x[rows], y[rows][:, None]
        residual = xb @ w + b - yb
        w = w - LR * (2.0 / len(rows)) * (xb.T @ residual)
        b = b - LR * (2.0 / len(rows)) * residual.sum(axis=0)
    return w, b


@pytest.mark.parametrize("last_batch, batches, said", [
    ("drop", [list(range(0, 8))],
     "data: 12 rows, global_batch_size 8: 1 batch per epoch uses 8 rows; the last 4 rows are never used"),
    ("pad", [list(range(0, 8)), list(range(8, 12)) + list(range(0, 4))],
     "data: 12 rows, global_batch_size 8: 2 batches per epoch; the last one's 4 rows are padded with 4"),
])
def test_multi_batch_training_walks_the_same_batches_as_numpy(tmp_path, last_batch, batches, said):
    x, y = _data(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: batches
        data: {{source: file, path: data.csv, target_column: 1, last_batch: {last_batch}}}
        optimizer: {{name: sgd, learning_rate: {LR}}}
        train: {{num_steps: {STEPS}, global_batch_size: {BATCH}}}
        logging: {{log_every_steps: 1}}
        checkpoint: {{every_steps: 0}}
        cluster: {{backend: local, num_processes: 2, devices_per_process: 1}}
        """))
    run_dir = tmp_path / "run"
    result = launch(str(spec), "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert said in result.stdout
    with np.load(os.path.join(run_dir, "params.npz")) as f:
        got = [f[k] for k in sorted(f.files)]  # "[0]" (w), "[1]" (b)
    want = _reference(x, y, batches)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


def test_a_non_finite_value_in_an_npy_file_names_its_row(tmp_path):
    table = np.ones((16, 3), np.float32)
    table[11, 2] = np.nan
    np.save(tmp_path / "data.npy", table)
    spec = tmp_path / "job.yaml"
    spec.write_text(textwrap.dedent("""\
        name: nonfinite
        data: {source: file, path: data.npy}
        train: {num_steps: 2, global_batch_size: 8}
        checkpoint: {every_steps: 0}
        cluster: {backend: local, num_processes: 2, devices_per_process: 1}
        """))
    # the workers' own check (the launcher's before start, launcher.spec.datafiles, left out)
    result = launch(str(spec), "--run-dir", str(tmp_path / "run"), PODLAUNCH_DATA_CHECK_MAX_BYTES="0")
    assert result.returncode == 1, result.stdout[-3000:]
    # rows 8..11 are process 0's share of batch 1
    assert f"{tmp_path / 'data.npy'}: row 12, column 3: nan is not a finite number" \
        in result.stdout, result.stdout[-3000:]
    assert "FAILED: process_id 0" in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize("fmt", ["npy", "npz"])
def test_a_resume_in_the_middle_of_an_epoch_continues_the_same_batches(tmp_path, fmt):
    """24 rows, batches of 8: 3 batches per epoch. Stop after step 4 (checkpoint there: the next
    batch is the epoch's second), resume to step 7: the params equal numpy walking the batches
    0,1,2,0,1,2,0 without a break. The data is a .npy (target column 1) or a .npz (x, y)."""
    rng = np.random.default_rng(11)
    rows, batch = 24, 8
    x = rng.standard_normal((rows, FEATURES))
    y = x @ np.array([1.5, -2.0, 0.5]) + 0.3 + 0.01 * rng.standard_normal(rows)
    if fmt == "npy":
        np.save(tmp_path / "data.npy", np.column_stack([x[:, 0], y, x[:, 1:]]).astype(np.float32))
        data = "{source: file, path: data.npy, target_column: 1}"
    else:
        np.savez(tmp_path / "data.npz", x=x.astype(np.float32), y=y.astype(np.float32))
        data = "{source: file, path: data.npz}"
    spec = tmp_path / "job.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: resume-mid-epoch
        data: {data}
        optimizer: {{name: sgd, learning_rate: {LR}}}
        train: {{num_steps: 4, global_batch_size: {batch}}}
        logging: {{log_every_steps: 1}}
        checkpoint: {{every_steps: 4}}
        cluster: {{backend: local, num_processes: 2, devices_per_process: 1}}
        """))
    run_dir = tmp_path / "run"
    first = launch(str(spec), "--run-dir", str(run_dir))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    resumed = launch(str(spec), "--resume", str(run_dir), "--set", f"train.num_steps={STEPS}")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr
    assert "resumed from the checkpoint of step 4 (attempt 1)" in \
        (run_dir / "logs" / "attempt-1" / "process-000.log").read_text()
    with np.load(os.path.join(run_dir, "params.npz")) as f:
        got = [f[k] for k in sorted(f.files)]
    batches = [list(range(i * batch, (i + 1) * batch)) for i in range(rows // batch)]
    want = _reference(x.astype(np.float32).astype(np.float64),
                      y.astype(np.float32).astype(np.float64), batches)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


def test_a_file_too_short_for_a_batch_since_the_check_is_bad_data_in_one_line(tmp_path):
    """Issue 71: a .npy replaced after the launch checked it (its rows now short of one global
    batch) ended in the order's raw ValueError and its traceback, exit 1. ``make_order`` is what
    every worker builds its batches' order with, from the rows it finds in the file."""
    from worker.contract import sections
    from worker.data.batches import make_order
    from worker.data.sources import DataError

    data = sections.Data(source="file", path=str(tmp_path / "rows.npy"))
    assert make_order(data, 256, 32).num_batches == 8
    with pytest.raises(DataError) as said:
        make_order(data, 10, 32)
    assert str(said.value).startswith(f"{tmp_path / 'rows.npy'}: 10 rows cannot fill a global "
                                      "batch of 32, though it could when the launch checked it")
    with pytest.raises(ValueError):  # synthetic rows are the spec's, checked before the start
        make_order(sections.Data(source="synthetic"), 10, 32)


@pytest.mark.slow
def test_a_npy_swapped_after_the_check_ends_the_run_in_one_line_of_bad_data(tmp_path):
    np.save(tmp_path / "data.npy", np.random.default_rng(0).random((256, 5), dtype=np.float32))
    np.save(tmp_path / "short.npy", np.ones((10, 5), dtype=np.float32))
    spec = tmp_path / "job.yaml"
    spec.write_text("name: swap\ntask: {name: linear_regression}\n"
                    "data: {source: file, path: data.npy}\n"
                    "train: {num_steps: 20, global_batch_size: 32}\ncluster: {num_processes: 2}\n")
    with launched(str(spec), "--run-dir", str(tmp_path / "run")) as out:
        out.wait_for(r"^podlaunch: attempt 0: starting", 120)  # checked; the workers read it later
        os.replace(tmp_path / "short.npy", tmp_path / "data.npy")
        code, text = out.finish(120)
    assert code == 1, text[-3000:]
    assert "Traceback" not in text and "ValueError" not in text, text[-3000:]
    assert re.search(rf"attempt 0 failed: process_id \d on localhost exited with code 5, bad data "
                     rf".*: {re.escape(str(tmp_path / 'data.npy'))}: 10 rows cannot fill a global "
                     rf"batch of 32, though it could when the launch checked it", text), text[-3000:]
