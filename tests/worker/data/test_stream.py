"""The input pipeline's parts without JAX workers: the order, the sources, the prefetching reader.

Real files (.npy, .npz, .csv written by numpy), read back through the same
code the workers run; placement is the identity here (the workers' is
``worker.trainer.train.place``, exercised by the end-to-end tests).
"""

from __future__ import annotations

import os
import threading
import zipfile

import numpy as np
import pytest

from worker.data import batches as datasets
from worker.data.order import Order, Permutation
from worker.data.sources import DataError, NpyTable, NpzArrays, csv_cache, open_source


@pytest.mark.parametrize("size", [1, 2, 3, 5, 64, 1000, 4097])
def test_a_permutation_is_a_bijection_and_differs_by_epoch(size):
    rows = Permutation(size, seed=3, epoch=0)(np.arange(size))
    assert sorted(rows.tolist()) == list(range(size))
    np.testing.assert_array_equal(rows, Permutation(size, seed=3, epoch=0)(np.arange(size)))
    if size >= 64:
        assert not np.array_equal(rows, Permutation(size, seed=3, epoch=1)(np.arange(size)))
        assert not np.array_equal(rows, Permutation(size, seed=4, epoch=0)(np.arange(size)))
        assert not np.array_equal(rows, np.arange(size))  # it does shuffle


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("pad", [False, True])
def test_the_process_shares_make_the_global_batch_on_every_topology(shuffle, pad):
    order = Order(100, 16, pad=pad, shuffle=shuffle, seed=9)
    assert order.num_batches == (7 if pad else 6)
    for step in range(20):
        whole = order.global_rows(step)
        for processes in (1, 2, 4, 8):
            got = np.concatenate([order.process_rows(step, p, processes) for p in range(processes)])
            np.testing.assert_array_equal(got, whole)
    # an epoch without pad uses num_batches * B distinct rows; shuffled, a different set each epoch
    epoch0 = np.concatenate([order.global_rows(s) for s in range(order.num_batches)])
    epoch1 = np.concatenate([order.global_rows(s) for s in range(order.num_batches, 2 * order.num_batches)])
    if not pad:
        assert len(set(epoch0.tolist())) == 96
    assert (not np.array_equal(epoch0, epoch1)) == shuffle
    # the position is a function of the step alone
    assert order.position(15) == {"epoch": 2, "offset": (15 % order.num_batches) * 16,
                                  "next_batch": 15 % order.num_batches,
                                  "num_batches": order.num_batches, "shuffle": shuffle,
                                  "shuffle_seed": 9}


def _table(tmp_path, rows=40, columns=4):
    table = np.arange(rows * columns, dtype=np.float32).reshape(rows, columns)
    np.save(tmp_path / "t.npy", table)
    return table


def test_npy_rows_are_read_from_a_memory_map_shuffled_or_not(tmp_path):
    table = _table(tmp_path)
    source = NpyTable(str(tmp_path / "t.npy"), target_column=1, target_dtype="float32")
    for rows in (np.arange(8, 16), np.array([33, 2, 17, 5])):
        got = source.read(rows)
        np.testing.assert_array_equal(got["x"], table[rows][:, [0, 2, 3]])
        np.testing.assert_array_equal(got["y"], table[rows][:, 1:2])
    assert isinstance(source.mapped.table, np.memmap)


def test_a_non_finite_value_names_the_file_row_and_column(tmp_path):
    table = _table(tmp_path)
    table[21, 2] = np.inf
    np.save(tmp_path / "t.npy", table)
    source = NpyTable(str(tmp_path / "t.npy"), target_column=-1, target_dtype="float32")
    source.read(np.arange(0, 20))
    with pytest.raises(DataError, match=r"t\.npy: row 22, column 3: inf is not a finite"):
        source.read(np.array([3, 21, 7]))


def test_a_short_file_is_a_data_error_not_a_sigbus(tmp_path):
    _table(tmp_path)
    path = tmp_path / "t.npy"
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # cut after row 30 and a half
        f.truncate(size - 9 * 16 - 8)
    with pytest.raises(DataError, match=r"too short for its 40 rows: row 31,"):
        NpyTable(str(path), -1, "float32")
    _table(tmp_path)
    source = NpyTable(str(path), -1, "float32")
    with open(path, "r+b") as f:  # the file shrinks while it is mapped
        f.truncate(size - 20 * 16)
    source.read(np.arange(0, 8))
    with pytest.raises(DataError, match=r"row 21, column 1 onwards are missing"):
        source.read(np.arange(16, 24))


def test_integer_labels_must_be_whole(tmp_path):
    table = np.column_stack([np.ones((6, 2)), [0, 1, 2, 3, 4, 5.5]]).astype(np.float32)
    np.save(tmp_path / "t.npy", table)
    source = NpyTable(str(tmp_path / "t.npy"), -1, "int32")
    got = source.read(np.arange(0, 4))
    assert got["y"].dtype == np.int32 and got["y"].tolist() == [0, 1, 2, 3]
    with pytest.raises(DataError, match=r"row 6, column 3: label 5.5 is not a whole"):
        source.read(np.arange(2, 6))


def test_csv_is_converted_once_with_every_cell_checked(tmp_path):
    (tmp_path / "d.csv").write_text("a,b,label\n1,2,0\n3,4,1\n5,6,2\n")
    first = csv_cache(str(tmp_path / "d.csv"), str(tmp_path / "cache"))
    assert csv_cache(str(tmp_path / "d.csv"), str(tmp_path / "cache")) == first
    np.testing.assert_array_equal(np.load(first), [[1, 2, 0], [3, 4, 1], [5, 6, 2]])
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n3,x4\n")
    with pytest.raises(DataError, match=r"bad\.csv: line 3, column 2: 'x4' is not a number"):
        csv_cache(str(tmp_path / "bad.csv"), str(tmp_path / "cache"))
    (tmp_path / "nan.csv").write_text("1,2\nNaN,4\n")
    with pytest.raises(DataError, match=r"nan\.csv: line 2, column 1: 'NaN' is not a finite number"):
        csv_cache(str(tmp_path / "nan.csv"), str(tmp_path / "cache"))
    (tmp_path / "short.csv").write_text("1,2\n3\n")
    with pytest.raises(DataError, match=r"short\.csv: line 2 has 1 columns, expected 2"):
        csv_cache(str(tmp_path / "short.csv"), str(tmp_path / "cache"))
    assert not [n for n in os.listdir(tmp_path / "cache") if ".tmp-" in n]


@pytest.mark.parametrize("compress", [False, True])
def test_npz_arrays_by_name_stored_ones_memory_mapped(tmp_path, compress):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((30, 3)).astype(np.float32)
    y = rng.standard_normal(30).astype(np.float32)
    label = rng.integers(0, 5, 30).astype(np.int32)
    (np.savez_compressed if compress else np.savez)(tmp_path / "d.npz", x=x, y=y, label=label)
    source = NpzArrays(str(tmp_path / "d.npz"))
    assert source.num_rows == 30
    assert isinstance(source.arrays["x"], np.ndarray) == compress
    rows = np.array([4, 29, 0])
    got = source.read(rows)
    np.testing.assert_array_equal(got["x"], x[rows])
    np.testing.assert_array_equal(got["y"], y[rows][:, None])
    assert got["label"].dtype == np.int32 and got["label"].tolist() == label[rows].tolist()
    with zipfile.ZipFile(tmp_path / "d.npz") as archive:
        assert {i.filename for i in archive.infolist()} == {"x.npy", "y.npy", "label.npy"}


class _Job:
    source, path, target_column, target_dtype = "file", "", -1, "float32"
    last_batch, shuffle, shuffle_seed = "drop", True, 5


def test_batches_are_read_ahead_at_most_prefetch_calls_in_step_order(tmp_path):
    table = _table(tmp_path, rows=64)
    job = _Job()
    job.path = str(tmp_path / "t.npy")
    source = open_source(job, str(tmp_path))
    reads, lock = [], threading.Lock()
    read = source.read

    def counted(rows):
        with lock:
            reads.append(rows)
        return read(rows)

    source.read = counted
    order = datasets.make_order(job, source.num_rows, 16)
    batches = datasets.Batches(source, order, process_id=1, num_processes=2, local_device_count=2,
                               place=lambda tree: tree, steps_per_call=1, prefetch=2,
                               first_step=3, num_steps=20)
    try:
        assert not batches.resident
        deadline = 50
        while len(reads) < 3 and deadline:  # the queue holds 2, the thread a third
            threading.Event().wait(0.05)
            deadline -= 1
        threading.Event().wait(0.2)
        assert len(reads) == 3  # never more than prefetch + 1 batches read ahead
        for step in range(3, 20):
            (batch,) = batches.get(step)
            rows = order.process_rows(step, 1, 2)
            np.testing.assert_array_equal(batch["x"].reshape(-1, 3), table[rows][:, :3])
            assert batch["x"].shape == (2, 4, 3)
    finally:
        batches.close()


def test_a_bad_row_in_the_reading_thread_reaches_the_training_thread(tmp_path):
    table = _table(tmp_path, rows=64)
    table[50, 0] = np.nan
    np.save(tmp_path / "t.npy", table)
    job = _Job()
    job.path, job.shuffle = str(tmp_path / "t.npy"), False
    source = open_source(job, str(tmp_path))
    order = datasets.make_order(job, source.num_rows, 16)
    batches = datasets.Batches(source, order, 0, 1, 1, place=lambda tree: tree, prefetch=1,
                               first_step=0, num_steps=8)
    try:
        for step in range(3):
            batches.get(step)
        with pytest.raises(DataError, match=r"row 51, column 1: nan"):
            batches.get(3)
    finally:
        batches.close()


class _Synthetic:
    source, num_examples, in_features, out_features, noise_std, seed = "synthetic", 9000, 3, 2, 0.1, 4


def test_synthetic_rows_are_the_same_read_in_order_or_shuffled():
    from worker.data.sources import Synthetic, synthetic_rows

    source = Synthetic(_Synthetic)
    x, y = synthetic_rows(4, 3, 2, 0.1, 0, 9000)
    for rows in (np.arange(4000, 8300), np.array([8999, 0, 4096, 4095, 17])):
        got = source.read(rows)
        np.testing.assert_array_equal(got["x"], x[rows])
        np.testing.assert_array_equal(got["y"], y[rows])


def test_resident_batches_are_read_and_placed_once(tmp_path):
    _table(tmp_path, rows=64)
    job = _Job()
    job.path, job.shuffle = str(tmp_path / "t.npy"), False
    source = open_source(job, str(tmp_path))
    placed = []
    order = datasets.make_order(job, source.num_rows, 8)  # 8 batches, more than prefetch 2
    batches = datasets.Batches(source, order, 0, 1, 1, place=lambda t: placed.append(t) or t,
                               prefetch=2, first_step=0, num_steps=40, resident=True)
    assert batches.resident and batches._thread is None
    got = [batches.get(step)[0] for step in range(40)]
    assert len(placed) == 8 and all(got[s] is got[s % 8] for s in range(40))
