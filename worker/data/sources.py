"""Random access to a dataset's rows, read when a batch needs them.

A source maps row indices to a batch: a dict of named arrays, each
``[len(rows), ...]``. File sources never hold the dataset: a ``.npy`` and the
uncompressed members of an ``.npz`` are memory-mapped (the pages of the rows
read are file cache, not the process's anonymous memory); a ``.csv`` is
converted once, every cell checked, to a cached ``.npy`` beside the run
(``<run dir>/data-cache/``) and memory-mapped. Every batch read is checked:
a value that is not finite, or a row past the end of a file that shrank, is a
``DataError`` naming the file, the row and the column, never a NaN loss later.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import tempfile
import zipfile

import numpy as np

from worker.contract import csvdata, datavalues, runfiles
from worker.contract import sections

CACHE_DIR = "data-cache"  # under the run directory
SYNTHETIC_CHUNK_ROWS = 4096  # synthetic rows come in chunks, each from its own seed ...
SYNTHETIC_CHUNK_BYTES = 16 << 20  # ... of at most this many bytes (wide rows: fewer per chunk)
ALIGN_BYTES = 64  # host buffers this aligned are used in place by JAX's CPU devices


class DataError(ValueError):
    """Bad data found while reading: the message names the file, row and column."""


@functools.lru_cache(maxsize=2)  # every chunk needs it; one job uses one
def synthetic_truth(seed: int, in_features: int, out_features: int) -> tuple[np.ndarray, np.ndarray]:
    """The true ``w [in, out]`` and ``b [out]`` (float32) of the synthetic data (read-only)."""
    rng = np.random.default_rng([seed, 0])
    w, b = (rng.standard_normal((in_features, out_features)).astype(np.float32),
            rng.standard_normal(out_features).astype(np.float32))
    w.flags.writeable = b.flags.writeable = False
    return w, b


def chunk_rows(in_features: int, out_features: int) -> int:
    """Rows per synthetic chunk: 4,096, fewer for rows wider than 1,024 features, so that a
    chunk is at most ``SYNTHETIC_CHUNK_BYTES`` however wide (``in_features: 2000000`` with 8
    examples once allocated 30.5 GiB per process for a 4,096-row chunk)."""
    width_bytes = 4 * (in_features + out_features)
    return max(1, min(SYNTHETIC_CHUNK_ROWS, SYNTHETIC_CHUNK_BYTES // width_bytes))


def synthetic_chunk(seed: int, in_features: int, out_features: int, noise_std: float,
                    chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``[chunk*R, (chunk+1)*R)`` (R = ``chunk_rows``) of
    ``y = x @ w_true + b_true + noise_std * N(0, 1)``.

    Returns x ``[R, in]`` and y ``[R, out]``, float32, from seed ``[seed, 1, chunk]``:
    row r is the same whoever generates it.
    """
    w, b = synthetic_truth(seed, in_features, out_features)
    rows = chunk_rows(in_features, out_features)
    rng = np.random.default_rng([seed, 1, chunk])
    x = rng.standard_normal((rows, in_features), dtype=np.float32)
    noise = rng.standard_normal((rows, out_features), dtype=np.float32)
    return x, x @ w + b + np.float32(noise_std) * noise


def synthetic_rows(seed: int, in_features: int, out_features: int, noise_std: float,
                   start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``[start, stop)`` of the synthetic data: x ``[n, in]``, y ``[n, out]`` float32."""
    per = chunk_rows(in_features, out_features)
    chunks = [synthetic_chunk(seed, in_features, out_features, noise_std, c)
              for c in range(start // per, (stop - 1) // per + 1)]
    lo = start % per
    x = np.concatenate([c[0] for c in chunks])[lo:lo + stop - start]
    y = np.concatenate([c[1] for c in chunks])[lo:lo + stop - start]
    return x, y


def aligned_empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised C-order array whose data starts on an ``ALIGN_BYTES`` boundary.

    JAX's CPU client uses a host buffer in place (no copy) when it is C-contiguous and
    aligned: measured with jax 0.10.2, 64-byte-aligned numpy arrays are aliased by
    ``jax.device_put`` and 16-byte-aligned ones (numpy's default) are copied (XLA's
    ``BufferFromHostBuffer``, ``HostBufferSemantics::kImmutableZeroCopy``).
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN_BYTES, np.uint8)
    skip = -raw.ctypes.data % ALIGN_BYTES
    return raw[skip:skip + nbytes].view(dtype).reshape(shape)


def aligned(array: np.ndarray) -> np.ndarray:
    """``array`` itself when C-contiguous and ``ALIGN_BYTES``-aligned, else an aligned copy."""
    if array.flags.c_contiguous and array.ctypes.data % ALIGN_BYTES == 0:
        return array
    out = aligned_empty(array.shape, array.dtype)
    np.copyto(out, array)
    return out


class Synthetic:
    """The synthetic dataset, generated in chunks on first use into one table per array and
    kept (it is generated, not read: ``launcher.spec.checks.check_fits_in_memory`` bounds it).

    The tables are allocated whole but only the chunks used are written, so the pages of
    rows never read are never touched. Contiguous rows (unshuffled) are read as views of the
    tables, no copy; shuffled rows are one gather into a new aligned batch.
    """

    def __init__(self, data: sections.Data):
        self.data, self.num_rows = data, data.num_examples
        self.name = "synthetic data"
        self._x = aligned_empty((self.num_rows, data.in_features), np.float32)
        self._y = aligned_empty((self.num_rows, data.out_features), np.float32)
        self._made: set = set()
        self.per_chunk = chunk_rows(data.in_features, data.out_features)

    def _make(self, chunks) -> None:
        d = self.data
        for chunk in chunks:
            if chunk in self._made:
                continue
            x, y = synthetic_chunk(d.seed, d.in_features, d.out_features, d.noise_std, chunk)
            lo = chunk * self.per_chunk
            hi = min(lo + self.per_chunk, self.num_rows)
            self._x[lo:hi], self._y[lo:hi] = x[:hi - lo], y[:hi - lo]
            self._made.add(chunk)

    def generate(self, rows: np.ndarray) -> None:
        """Make the chunks holding ``rows`` now (``worker.data.batches.Batches``: before step 1)."""
        self._make(int(c) for c in np.unique(rows // self.per_chunk))

    def read(self, rows: np.ndarray) -> dict:
        """Rows as ``{"x": [n, in], "y": [n, out]}`` float32: views when contiguous (never
        written again), else copies."""
        if _contiguous(rows):
            start, stop = int(rows[0]), int(rows[-1]) + 1
            self._make(range(start // self.per_chunk, (stop - 1) // self.per_chunk + 1))
            return {"x": self._x[start:stop], "y": self._y[start:stop]}
        if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= self.num_rows):
            raise IndexError(f"synthetic data: rows outside [0, {self.num_rows})")
        self.generate(rows)
        # mode="clip" (the rows are checked above): with the default "raise", numpy's take
        # gathers into a temporary and copies that into ``out``, a second copy
        return {name: np.take(table, rows, axis=0, mode="clip",
                              out=aligned_empty((len(rows),) + table.shape[1:], table.dtype))
                for name, table in (("x", self._x), ("y", self._y))}


def _contiguous(rows: np.ndarray) -> bool:
    return len(rows) > 0 and int(rows[-1]) - int(rows[0]) == len(rows) - 1 and bool(
        np.all(np.diff(rows) == 1))


def _take(table: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Rows of a memory-mapped table as an in-memory array (a slice when they are contiguous)."""
    if _contiguous(rows):
        return np.array(table[int(rows[0]):int(rows[-1]) + 1])
    return table[rows]  # fancy indexing copies only these rows


def check_finite(name: str, values: np.ndarray, rows: np.ndarray, what: str = "") -> None:
    """Raise ``DataError`` naming the first value of ``values`` (rows ``rows`` of the file) that
    breaks the data values' rule (``worker.contract.datavalues``)."""
    bad = datavalues.first_bad(values, rows, what)
    if bad is not None:
        raise DataError(f"{name}: {bad}")


class _Mapped:
    """One memory-mapped array of a file, guarded against the file shrinking under it.

    Reading a page of a mapping past the end of its (truncated) file is SIGBUS;
    so before each read the file's size is checked against the last row wanted.
    """

    def __init__(self, path: str, offset: int, shape: tuple, dtype: np.dtype, label: str):
        self.path, self.label, self.shape, self.dtype = path, label, shape, dtype
        self.offset = offset
        self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        size = os.path.getsize(path)
        self._check_size(size, shape[0])
        self.table = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
        self._fd = os.open(path, os.O_RDONLY)

    def _check_size(self, size: int, rows_needed: int) -> None:
        if size < self.offset + rows_needed * self.row_bytes:
            whole = max(0, (size - self.offset) // self.row_bytes) if self.row_bytes else 0
            raise DataError(f"{self.path}: {self.label}the file is {size} bytes, too short for its "
                            f"{self.shape[0]} rows: row {whole + 1}, column 1 onwards are "
                            "missing (a truncated copy?); copy the file again")

    def read(self, rows: np.ndarray, copy: bool = True) -> np.ndarray:
        """The rows (a copy; with ``copy`` False, contiguous rows are a view of the map)."""
        self._check_size(os.fstat(self._fd).st_size, int(rows.max()) + 1)
        if not copy and _contiguous(rows):
            return self.table[int(rows[0]):int(rows[-1]) + 1]
        return _take(self.table, rows)


def _npy_header(stream, name: str = "") -> tuple[tuple, np.dtype, bool]:
    version = np.lib.format.read_magic(stream)
    read = (np.lib.format.read_array_header_1_0 if version[0] == 1
            else np.lib.format.read_array_header_2_0)
    try:
        return read(stream)
    except ValueError as exc:  # numpy's words advise allow_pickle=True: never for data
        if "max_header_size" not in str(exc):
            raise
        raise DataError(f"{name}: its .npy header is longer than numpy's 10,000 bytes; save "
                        "the array again with numpy.save") from None


def _compressed(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str, key: str):
    """A compressed member (no random access), read whole once its header says it fits in
    this host's available memory; DataError if not: never numpy's _ArrayMemoryError."""
    with archive.open(info) as f:
        shape, _, dtype = _npy_header(f, f"{path}: array {key!r}")
    expanded = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    said = f"{path}: array {key!r} is compressed and expands to {expanded:,} bytes, more "
    advice = "; save the arrays with numpy.savez, uncompressed (each process reads its rows)"
    with open("/proc/meminfo", encoding="ascii") as f:  # MemAvailable: N kB
        free = [int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:")]
    if free and expanded > free[0]:
        raise DataError(f"{said}than this host's available memory ({free[0]:,} bytes){advice}")
    try:
        with archive.open(info) as f:
            return np.load(f, allow_pickle=False)
    except MemoryError:
        raise DataError(f"{said}memory than this process could get{advice}") from None


class NpyTable:
    """A ``.npy`` ``[rows, columns]``: ``target_column`` is ``y``, the other columns ``x``.

    ``y`` is ``[rows, 1]`` float32, or ``[rows]`` int32 labels when ``target_dtype`` is int32
    (every label must then be a whole number).
    """

    def __init__(self, path: str, target_column: int, target_dtype: str, label: str = ""):
        with open(path, "rb") as f:
            shape, fortran, dtype = _npy_header(f, path)
            offset = f.tell()
        if fortran or len(shape) != 2:
            raise DataError(f"{path}: expected a C-order 2-D array [rows, columns], got shape "
                            f"{shape}{' in Fortran order' if fortran else ''}")
        self.path, self.name, self.num_rows = path, path, shape[0]
        self.mapped = _Mapped(path, offset, shape, np.dtype(dtype), label)
        self.target = target_column % shape[1]
        self.target_dtype = target_dtype
        self.num_classes: int | None = None  # set from the task: labels must be 0..n-1

    def read(self, rows: np.ndarray) -> dict:
        table = self.mapped.read(rows, copy=False)  # read once into x and y below
        check_finite(self.name, table, rows)
        # x in one pass (the columns around the target, cast to float32) into an aligned
        # batch that the devices then use in place
        x = aligned_empty((len(table), table.shape[1] - 1), np.float32)
        x[:, :self.target], x[:, self.target:] = table[:, :self.target], table[:, self.target + 1:]
        y = np.array(table[:, self.target:self.target + 1])
        if self.target_dtype == "int32":
            labels = y[:, 0]
            wrong = np.flatnonzero(labels != np.round(labels))
            if wrong.size:
                raise DataError(f"{self.name}: row {int(rows[wrong[0]]) + 1}, column "
                                f"{self.target + 1}: label {float(labels[wrong[0]])!r} is not a "
                                "whole number (data.target_dtype: int32)")
            if self.num_classes is not None:
                outside = np.flatnonzero((labels < 0) | (labels >= self.num_classes))
                if outside.size:
                    raise DataError(f"{self.name}: row {int(rows[outside[0]]) + 1}, column "
                                    f"{self.target + 1}: label {float(labels[outside[0]])!r} is "
                                    f"outside 0..{self.num_classes - 1} (the task's num_classes "
                                    f"{self.num_classes}): a NaN loss, or silent training on it")
            return {"x": x, "y": labels.astype(np.int32)}
        return {"x": x, "y": y.astype(np.float32, copy=False)}


class NpzArrays:
    """An ``.npz``'s arrays by name, each ``[rows, ...]``: stored members memory-mapped,
    compressed ones (``numpy.savez_compressed``) read whole (deflate has no random access)."""

    def __init__(self, path: str):
        self.path, self.name, self.arrays = path, path, {}
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                key = info.filename[:-4]
                if info.compress_type == zipfile.ZIP_STORED:
                    with open(path, "rb") as raw:  # the local header's lengths, then the .npy
                        raw.seek(info.header_offset + 26)
                        name_len, extra_len = np.frombuffer(raw.read(4), "<u2")
                        start = info.header_offset + 30 + int(name_len) + int(extra_len)
                        raw.seek(start)
                        shape, fortran, dtype = _npy_header(raw, f"{path}: array {key!r}")
                        offset = raw.tell()
                    if not fortran and len(shape) >= 1:
                        self.arrays[key] = _Mapped(path, offset, shape, np.dtype(dtype),
                                                   f"array {key!r}: ")
                        continue
                self.arrays[key] = _compressed(archive, info, path, key)
        rows = {k: (a.shape[0] if a.shape else 0) for k, a in self.arrays.items()}
        if len(set(rows.values())) != 1:
            raise DataError(f"{path}: arrays have different row counts {rows}; every array "
                            "needs one row per example")
        self.num_rows = next(iter(rows.values()))

    def read(self, rows: np.ndarray) -> dict:
        out = {}
        for key, array in self.arrays.items():
            values = array.read(rows) if isinstance(array, _Mapped) else array[rows]
            check_finite(self.name, values, rows, f"array {key!r}, ")
            out[key] = values.astype(np.float32, copy=False) if values.dtype.kind == "f" else values
        if "y" in out and out["y"].ndim == 1 and out["y"].dtype.kind == "f":
            out["y"] = out["y"][:, None]  # targets as a column, like .npy and .csv
        return out


def csv_cache(path: str, cache_dir: str) -> str:
    """Convert a ``.csv`` to a float64 ``.npy`` once, every cell checked; return its path.

    The cache is named by the file's path, size and modification time, and written
    under an exclusive lock: the processes of one host convert it once between them.

    Raises:
      DataError: a cell that is not a number, a non-finite value, a short or long
        row: the file, its line and its column.
    """
    st = os.stat(path)
    key = hashlib.sha256(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    os.makedirs(cache_dir, exist_ok=True)
    final = os.path.join(cache_dir, f"{os.path.basename(path)}-{key[:16]}.npy")
    # the run directory is input: its lock, cache and temporary are never reached through a link
    with open(final + ".lock", "a", opener=runfiles.opener) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.islink(final):
            raise DataError(runfiles.refused(final).strerror)
        if os.path.exists(final):
            return final
        count, columns = 0, None
        for _, cells in _lines(path):  # counted first: the cache is written in place
            columns = len(cells) if columns is None else columns
            count += 1
        if columns is None:
            raise DataError(f"{path}: the file has no data rows")
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(final) + ".", suffix=".tmp", dir=cache_dir)
        os.close(fd)  # made here (O_EXCL): open_memmap opens it by name
        table = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float64, shape=(count, columns))
        for index, (number, cells) in enumerate(_lines(path)):
            try:
                table[index] = csvdata.parse_row(cells, number, columns)
            except csvdata.CsvError as exc:
                del table
                os.unlink(tmp)
                raise DataError(f"{path}: {exc}") from None
        table.flush()
        del table
        os.replace(tmp, final)
    return final


def _lines(path: str):
    with open(path, "r", encoding="utf-8") as f:
        yield from csvdata.data_lines(f)


def open_source(data: sections.Data, run_dir: str):
    """The source of a job's ``data`` section (``Synthetic``, ``NpyTable`` or ``NpzArrays``).

    Raises:
      DataError: the file is short, holds a bad cell (``.csv``), or is not a table.
      OSError: it cannot be read.
    """
    if data.source == "synthetic":
        return Synthetic(data)
    path = data.path
    try:
        if path.endswith(".npz"):
            return NpzArrays(path)
        if path.endswith(".csv"):
            source = NpyTable(csv_cache(path, os.path.join(run_dir, CACHE_DIR)),
                              data.target_column, data.target_dtype)
            source.name = f"{path} (converted: {source.path})"
            return source
        return NpyTable(path, data.target_column, data.target_dtype)
    except DataError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, zipfile.BadZipFile, EOFError) as exc:
        # the launcher read its header before the start: a file changed since (replaced while
        # the workers started, a copy still being written) is bad data, not a Python error
        raise DataError(f"{path}: cannot be read as the data the launch checked ({type(exc).__name__}: "
                        f"{exc}); was it changed or still being written after the launch "
                        "checked it? copy it whole, then launch again") from None
