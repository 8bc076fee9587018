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

import numpy as np

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


def own_rows(num_examples: int, global_batch_size: int, process_id: int,
             num_processes: int) -> list[tuple[int, int]]:
    """Row ranges ``[start, stop)`` this process owns, one per global batch.

    Raises:
      ValueError: the batch does not divide over processes, or exceeds the data.
    """
    if global_batch_size % num_processes:
        raise ValueError(f"global_batch_size {global_batch_size} does not divide over "
                         f"{num_processes} processes")
    num_batches = num_examples // global_batch_size
    if num_batches == 0:
        raise ValueError(f"{num_examples} rows cannot fill a global batch of {global_batch_size}")
    per_process = global_batch_size // num_processes
    return [(i * global_batch_size + process_id * per_process,
             i * global_batch_size + (process_id + 1) * per_process) for i in range(num_batches)]


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


def _file_rows(path: str, target_column: int, global_batch_size: int, process_id: int,
               num_processes: int):
    """Read only this process's rows of a .npy, .npz or .csv file."""
    if path.endswith(".npz"):
        with np.load(path) as arrays:  # npz members cannot be memory-mapped
            x_all, y_all = arrays["x"], arrays["y"]
        ranges = own_rows(len(x_all), global_batch_size, process_id, num_processes)
        x = np.concatenate([x_all[s:e] for s, e in ranges])
        y = np.concatenate([y_all[s:e] for s, e in ranges])
        return x, y.reshape(len(y), -1), ranges
    if path.endswith(".npy"):
        table = np.load(path, mmap_mode="r")  # only our rows are paged in
        ranges = own_rows(table.shape[0], global_batch_size, process_id, num_processes)
        rows = np.concatenate([np.asarray(table[s:e]) for s, e in ranges])
    else:  # .csv: every line is skimmed, only ours are parsed
        with open(path, "r", encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
        try:
            [float(c) for c in lines[0].split(",")]
        except ValueError:
            lines = lines[1:]  # a header
        ranges = own_rows(len(lines), global_batch_size, process_id, num_processes)
        rows = np.loadtxt([line for s, e in ranges for line in lines[s:e]],
                          delimiter=",", dtype=np.float64, ndmin=2)
    target = target_column % rows.shape[1]
    return np.delete(rows, target, axis=1), rows[:, target:target + 1], ranges


def load_shard(data: jobs.DataConfig, global_batch_size: int, process_id: int,
               num_processes: int, local_device_count: int) -> Shard:
    """Load this process's rows of every global batch, shaped for ``pmap``.

    Args:
      data: the job's ``data`` section.
      global_batch_size: examples per step over all devices.
      process_id, num_processes: this process's identity.
      local_device_count: devices of this process.

    Returns:
      A Shard with x, y ``[num_batches, local_device_count, per_device_batch_size, features]``.

    Raises:
      ValueError: the batch does not divide, or the data is too small.
      OSError: the data file cannot be read.
    """
    if data.source == "synthetic":
        ranges = own_rows(data.num_examples, global_batch_size, process_id, num_processes)
        parts = [synthetic_rows(data.seed, data.in_features, data.out_features,
                                data.noise_std, s, e) for s, e in ranges]
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
    else:
        x, y, ranges = _file_rows(data.path, data.target_column, global_batch_size,
                                  process_id, num_processes)
    return _shape(x, y, len(ranges), local_device_count)


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
