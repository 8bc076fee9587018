"""Each process loads only its own shard of every global batch.

The dataset has ``num_examples`` rows. Global batch ``i`` is rows
``[i*B, (i+1)*B)`` with ``B = global_batch_size``; a trailing partial batch is
dropped, and step ``s`` (0-based) uses batch ``s % num_batches``. Within a
batch, process ``p`` of ``P`` owns the contiguous rows
``[p*B/P, (p+1)*B/P)``, split evenly over its local devices. So the union of
all shards is exactly the global batch whatever the topology, and the
parameters after N steps do not depend on how devices are split over processes.
"""

from __future__ import annotations

import dataclasses
import zipfile

import numpy as np

from worker import csvdata
from worker import job as jobs

# Synthetic rows are generated in fixed chunks, each from its own seed, so a
# process can generate its rows without generating anyone else's.
SYNTHETIC_CHUNK_ROWS = 4096


@dataclasses.dataclass(frozen=True)
class Shard:
    """This process's rows of every global batch.

    Attributes:
      x: ``[num_batches, local_device_count, per_device_batch_size, in_features]`` float32.
      y: ``[num_batches, local_device_count, per_device_batch_size, out_features]`` float32.
    """

    x: np.ndarray
    y: np.ndarray

    @property
    def num_batches(self) -> int:
        return self.x.shape[0]

    @property
    def in_features(self) -> int:
        return self.x.shape[-1]

    @property
    def out_features(self) -> int:
        return self.y.shape[-1]


def num_batches(num_examples: int, global_batch_size: int, pad: bool = False) -> int:
    """Global batches per epoch: whole ones only (``drop``), or the last one filled (``pad``)."""
    return -(-num_examples // global_batch_size) if pad else num_examples // global_batch_size


def own_rows(num_examples: int, global_batch_size: int, process_id: int,
             num_processes: int, pad: bool = False) -> list[tuple[int, int]]:
    """Row segments ``[start, stop)`` this process owns, in order, for every global batch.

    Batch ``i`` is rows ``i * global_batch_size`` onwards, each process taking
    its contiguous share. With ``pad``, a last batch the rows do not fill
    takes rows from the start again (so a segment may wrap: two segments);
    without it, the rows after the last whole batch are not used.

    Raises:
      ValueError: the batch does not divide over processes, or exceeds the data.
    """
    if global_batch_size % num_processes:
        raise ValueError(f"global_batch_size {global_batch_size} does not divide over "
                         f"{num_processes} processes")
    count = num_batches(num_examples, global_batch_size, pad)
    if count == 0:
        raise ValueError(f"{num_examples} rows cannot fill a global batch of {global_batch_size}")
    per_process = global_batch_size // num_processes
    segments = []
    for i in range(count):
        start = i * global_batch_size + process_id * per_process
        stop = start + per_process
        lo = start
        while lo < stop:  # more than one segment only when a padded batch wraps
            hi = min(stop, (lo // num_examples + 1) * num_examples)
            segments.append((lo % num_examples, (hi - 1) % num_examples + 1))
            lo = hi
    return segments


def synthetic_truth(seed: int, in_features: int, out_features: int) -> tuple[np.ndarray, np.ndarray]:
    """The true ``w [in, out]`` and ``b [out]`` (float32) of the synthetic data."""
    rng = np.random.default_rng([seed, 0])
    return (rng.standard_normal((in_features, out_features)).astype(np.float32),
            rng.standard_normal(out_features).astype(np.float32))


def synthetic_rows(seed: int, in_features: int, out_features: int, noise_std: float,
                   start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``[start, stop)`` of ``y = x @ w_true + b_true + noise_std * N(0, 1)``.

    Returns x ``[stop-start, in]`` and y ``[stop-start, out]``, float32. Row r
    is the same whoever generates it: chunk ``c`` comes from seed ``[seed, 1, c]``.
    """
    w, b = synthetic_truth(seed, in_features, out_features)
    xs, ys = [], []
    for chunk in range(start // SYNTHETIC_CHUNK_ROWS, (stop - 1) // SYNTHETIC_CHUNK_ROWS + 1):
        rng = np.random.default_rng([seed, 1, chunk])
        x = rng.standard_normal((SYNTHETIC_CHUNK_ROWS, in_features), dtype=np.float32)
        noise = rng.standard_normal((SYNTHETIC_CHUNK_ROWS, out_features), dtype=np.float32)
        lo = max(start - chunk * SYNTHETIC_CHUNK_ROWS, 0)
        hi = min(stop - chunk * SYNTHETIC_CHUNK_ROWS, SYNTHETIC_CHUNK_ROWS)
        xs.append(x[lo:hi])
        ys.append(x[lo:hi] @ w + b + np.float32(noise_std) * noise[lo:hi])
    return np.concatenate(xs), np.concatenate(ys)


def _file_rows(path: str, target_column: int, segments: list, table_rows: int | None = None):
    """Read only this process's rows of a .npy, .npz or .csv file.

    Raises:
      ValueError: a value is not finite (naming the file, its row and column).
    """
    if path.endswith(".npz"):
        with np.load(path) as arrays:  # npz members cannot be memory-mapped
            x_all, y_all = arrays["x"], arrays["y"]
        x = np.concatenate([x_all[s:e] for s, e in segments])
        y = np.concatenate([y_all[s:e] for s, e in segments])
        y = y.reshape(len(y), -1)
        _check_finite(path, np.concatenate([x.reshape(len(x), -1), y], axis=1), segments)
        return x, y
    if path.endswith(".npy"):
        table = np.load(path, mmap_mode="r")  # only our rows are paged in
        rows = np.concatenate([np.asarray(table[s:e]) for s, e in segments])
        _check_finite(path, rows, segments)
    else:  # .csv: the launcher's pre-check and this reader are one parser (worker.csvdata)
        try:
            rows = np.array(csvdata.read_rows(path, segments), dtype=np.float64, ndmin=2)
        except csvdata.CsvError as exc:
            raise ValueError(f"{path}: {exc}") from None
    target = target_column % rows.shape[1]
    return np.delete(rows, target, axis=1), rows[:, target:target + 1]


def _check_finite(path: str, rows: np.ndarray, segments: list) -> None:
    """Raise ValueError naming the first non-finite value's row (0-based, in the file) and column."""
    bad = ~np.isfinite(rows)
    if not bad.any():
        return
    index, column = (int(v) for v in np.argwhere(bad)[0])
    file_rows = np.concatenate([np.arange(s, e) for s, e in segments])
    raise ValueError(f"{path}: row {int(file_rows[index])} (0-based), column {column + 1}: "
                     f"{float(rows[index, column])!r} is not a finite number; data must be finite "
                     "(fix or drop the row)")


def file_row_count(path: str) -> int:
    """Data rows of a .npy, .npz or .csv file (headers and blank lines not counted)."""
    if path.endswith(".npz"):  # the member's header only: _file_rows reads the arrays once
        with zipfile.ZipFile(path) as archive, archive.open("x.npy") as f:
            major, _ = np.lib.format.read_magic(f)
            read = (np.lib.format.read_array_header_1_0 if major == 1
                    else np.lib.format.read_array_header_2_0)
            return read(f)[0][0]
    if path.endswith(".npy"):
        return np.load(path, mmap_mode="r").shape[0]
    with open(path, "r", encoding="utf-8") as f:  # counted, not parsed: read_rows parses ours
        return sum(1 for _ in csvdata.data_lines(f))


def load_shard(data: jobs.DataConfig, global_batch_size: int, process_id: int,
               num_processes: int, local_device_count: int) -> Shard:
    """Load this process's rows of every global batch, shaped for ``pmap``.

    Args:
      data: the job's ``data`` section (``last_batch``: drop or pad a last partial batch).
      global_batch_size: examples per step over all devices.
      process_id, num_processes: this process's identity.
      local_device_count: devices of this process.

    Returns:
      A Shard with x, y ``[num_batches, local_device_count, per_device_batch_size, features]``.

    Raises:
      ValueError: the batch does not divide, the data is too small, or a value is not finite.
      OSError: the data file cannot be read.
    """
    pad = data.last_batch == "pad"
    rows = data.num_examples if data.source == "synthetic" else file_row_count(data.path)
    segments = own_rows(rows, global_batch_size, process_id, num_processes, pad)
    if data.source == "synthetic":
        parts = [synthetic_rows(data.seed, data.in_features, data.out_features,
                                data.noise_std, s, e) for s, e in segments]
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
    else:
        x, y = _file_rows(data.path, data.target_column, segments)
    return _shape(x, y, num_batches(rows, global_batch_size, pad), local_device_count)


def _shape(x: np.ndarray, y: np.ndarray, num_batches: int, local_device_count: int) -> Shard:
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.ascontiguousarray(y, dtype=np.float32)
    per_process = x.shape[0] // num_batches
    if per_process % local_device_count:
        raise ValueError(f"{per_process} rows per process do not divide over "
                         f"{local_device_count} local devices")
    per_device = per_process // local_device_count
    return Shard(x.reshape(num_batches, local_device_count, per_device, x.shape[-1]),
                 y.reshape(num_batches, local_device_count, per_device, y.shape[-1]))
