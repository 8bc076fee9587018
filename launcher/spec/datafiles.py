"""Read the shape of a data file without numpy, so specs are checked before launch.

Only headers are read: the ``.npy`` format header
(https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html), the
member headers inside an ``.npz`` zip, and the line count of a ``.csv``.
"""

from __future__ import annotations

import ast
import os
import struct
import zipfile
from typing import IO

from worker.contract import csvdata, datavalues

SUFFIXES = (".npy", ".npz", ".csv")
# .npy/.npz files up to this size have every value checked before anything starts (about a
# second per GiB here, memory-mapped); a larger one is checked by the workers as they read it.
# PODLAUNCH_DATA_CHECK_MAX_BYTES sets another size (0: leave every file to the workers).
VALUES_CHECKED_MAX_BYTES = 1 << 30
MAX_BYTES_VAR = "PODLAUNCH_DATA_CHECK_MAX_BYTES"
CHUNK_ROWS = 1 << 16
# numpy's own bound on an .npy header (numpy.lib.format's max_header_size): a longer one is
# refused here in podlaunch's words, not numpy's (whose advice is allow_pickle=True)
HEADER_MAX_BYTES = 10000
# a compressed .npz member (numpy.savez_compressed) is read whole by every process, and by the
# check before the start: one that expands past this many bytes is refused before anything
# starts (a 10 MB file of zeros expands to gigabytes). PODLAUNCH_COMPRESSED_MAX_BYTES sets
# another size.
COMPRESSED_MAX_BYTES = 1 << 30
COMPRESSED_VAR = "PODLAUNCH_COMPRESSED_MAX_BYTES"


class DataFileError(Exception):
    """The file is missing, unreadable, or not shaped like a dataset."""


def _npy_shape(stream: IO[bytes], name: str) -> tuple[int, ...]:
    return _npy_header(stream, name)[0]


def _npy_header(stream: IO[bytes], name: str) -> tuple[tuple[int, ...], int]:
    """The shape and the bytes per value of the .npy at the start of ``stream``."""
    magic = stream.read(8)
    if magic[:6] != b"\x93NUMPY":
        raise DataFileError(f"{name} is not an .npy file (bad magic bytes)")
    major = magic[6]
    size_format = "<H" if major == 1 else "<I"
    (header_len,) = struct.unpack(size_format, stream.read(struct.calcsize(size_format)))
    if header_len > HEADER_MAX_BYTES:
        raise DataFileError(f"{name}'s header is {header_len:,} bytes; numpy's are at most "
                            f"{HEADER_MAX_BYTES:,} (a longer one is not read: it may not be "
                            "numpy's): save the array again with numpy.save")
    header = ast.literal_eval(stream.read(header_len).decode("latin1"))
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise DataFileError(f"{name}'s header is not numpy's (a dict of descr, fortran_order "
                            f"and shape), got {_short(header)}; save the array with numpy.save")
    dims = header["shape"]
    if not isinstance(dims, tuple) or not all(type(d) is int and d >= 0 for d in dims):
        raise DataFileError(f"{name}'s header has shape {_short(dims)}; expected a tuple of "
                            "sizes >= 0: save the array with numpy.save")
    descr = header.get("descr")
    if not isinstance(descr, str) or descr[1:2] not in ("f", "i", "u", "b"):
        raise DataFileError(f"{name} holds dtype {descr!r}; expected numbers (float, int or bool): "
                            "save it with numpy.asarray(a, dtype=numpy.float32)")
    if header.get("fortran_order"):
        raise DataFileError(f"{name} is in Fortran order; save it with C order "
                            "(numpy.ascontiguousarray) so rows can be memory-mapped")
    return dims, int(descr[2:]) if descr[2:].isdigit() else 0


def _size(bytes_: int) -> str:
    return f"{bytes_ / (1 << 30):.1f} GiB" if bytes_ >= 1 << 30 else f"{bytes_ / (1 << 20):.1f} MiB"


def compressed_max_bytes() -> int:
    """The most a compressed .npz member may expand to (``COMPRESSED_VAR``, else
    ``COMPRESSED_MAX_BYTES``)."""
    limit = os.environ.get(COMPRESSED_VAR, "")
    return int(limit) if limit.isdigit() else COMPRESSED_MAX_BYTES


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def shape(path: str) -> tuple[int, int]:
    """Return (num_rows, num_columns) of a dataset file.

    For ``.npz`` files num_columns is the feature count of array ``x`` (0 when
    there is none: a task reads its arrays by name); for ``.npy`` and ``.csv``
    it counts every column, target included.

    Raises:
      DataFileError: with a message saying what is wrong with the file.
    """
    try:
        if path.endswith(".npy"):
            with open(path, "rb") as f:
                dims, itemsize = _npy_header(f, path)
                data_start = f.tell()
            if len(dims) != 2:
                raise DataFileError(f"expected a 2-D array [rows, columns], got shape {dims}")
            size, row_bytes = os.path.getsize(path), itemsize * dims[1]
            if row_bytes and size < data_start + dims[0] * row_bytes:  # a copy cut short
                raise DataFileError(
                    f"the file is {size} bytes, too short for its {dims[0]} rows: rows "
                    f"{(size - data_start) // row_bytes + 1} onwards (counted from 1) are missing (a "
                    "truncated copy?); copy the file again")
            return dims
        if path.endswith(".npz"):
            return _npz_shape(path)
        if path.endswith(".csv"):
            return _csv_shape(path)
    except OSError as exc:
        raise DataFileError(f"cannot read the file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DataFileError("not UTF-8 text; a .csv must be text") from None
    except (zipfile.BadZipFile, ValueError, SyntaxError, KeyError, struct.error) as exc:
        raise DataFileError(f"cannot read the file's header: {exc}") from None
    except (RecursionError, MemoryError):  # a header nested or sized beyond reason
        raise DataFileError("cannot read the file's header: it is not numpy's (nested too "
                            "deeply); save the array with numpy.save") from None
    raise DataFileError(f"expected a file ending in {', '.join(SUFFIXES)}")


def values_checked(path: str) -> bool:
    """Whether ``check_values`` reads every value of ``path`` (a .csv's are read by ``shape``)."""
    limit = os.environ.get(MAX_BYTES_VAR, "")
    limit = int(limit) if limit.isdigit() else VALUES_CHECKED_MAX_BYTES
    try:
        return not path.endswith((".npy", ".npz")) or os.path.getsize(path) <= limit
    except OSError:
        return False


def check_values(path: str) -> None:
    """Every value of a .npy (memory-mapped) or .npz finite, and finite in float32, before any
    worker starts: the workers' own rule and words (``worker.contract.datavalues``: row
    and column counted from 1). numpy is imported here only, for such a file; a file over
    ``VALUES_CHECKED_MAX_BYTES`` is left to the workers (``values_checked``).

    Raises:
      DataFileError: the first value that is not, its row, column and array named.
    """
    if path.endswith(".csv") or not values_checked(path):
        return
    import numpy as np  # only for a .npy/.npz's values: `launch --help` never pays for it

    try:
        if path.endswith(".npy"):
            arrays = {"": np.load(path, mmap_mode="r", allow_pickle=False)}
        else:
            with np.load(path, allow_pickle=False) as archive:
                arrays = {f"array {name!r}, ": archive[name] for name in archive.files}
        for what, table in arrays.items():
            flat = table.reshape(len(table), -1) if table.ndim else table.reshape(1, 1)
            for start in range(0, len(flat), CHUNK_ROWS):
                block = np.asarray(flat[start:start + CHUNK_ROWS])
                bad = datavalues.first_bad(block, np.arange(start, start + len(block)), what)
                if bad is not None:
                    raise DataFileError(bad)
    except (OSError, ValueError) as exc:
        raise DataFileError(f"cannot read its values: {exc}") from None
    except MemoryError:  # numpy's _ArrayMemoryError included: said, never its traceback
        raise DataFileError("cannot read its values: this machine has not the memory to read "
                            "them; save the arrays uncompressed (numpy.save, numpy.savez) so "
                            "they are read by rows") from None


def npz_arrays(path: str) -> dict:
    """``{name: shape}`` of every array of an ``.npz`` (member headers only).

    Raises:
      DataFileError: no arrays, an array with no row axis, or arrays with different row counts.
    """
    shapes = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = info.filename
            if name.endswith(".npy"):
                with archive.open(info) as f:
                    dims, itemsize = _npy_header(f, name[:-4])
                shapes[name[:-4]] = dims
                expanded = itemsize
                for d in dims:
                    expanded *= d
                if info.compress_type != zipfile.ZIP_STORED and expanded > compressed_max_bytes():
                    raise DataFileError(
                        f"array {name[:-4]!r} is compressed ({_size(info.compress_size)} in the "
                        f"file) and expands to {_size(expanded)}, which every process would "
                        f"read whole into memory (more than {_size(compressed_max_bytes())}, "
                        f"{COMPRESSED_VAR}): save the arrays with numpy.savez, uncompressed, "
                        "so each process reads only the rows it needs")
    if not shapes:
        raise DataFileError("holds no arrays; save with numpy.savez(path, x=features, y=targets)")
    rows = {name: shape[0] if shape else None for name, shape in shapes.items()}
    if None in rows.values() or len(set(rows.values())) != 1:
        raise DataFileError(f"expected arrays with one row per example (equal first dimensions), "
                            f"got {', '.join(f'{n} {s}' for n, s in shapes.items())}")
    return shapes


def _npz_shape(path: str) -> tuple[int, int]:
    shapes = npz_arrays(path)
    x = shapes.get("x")
    if x is not None and len(x) != 2:
        raise DataFileError(f"expected x [rows, features], got x {x}")
    return next(iter(shapes.values()))[0], x[1] if x is not None else 0


def _csv_shape(path: str) -> tuple[int, int]:
    """Rows and columns of a CSV, every cell checked by the workers' own parser.

    A bad cell is reported with its line and column before launch instead of
    crashing one worker (or, for a short row, hanging the job on mismatched
    shapes). Linear in the file's size: use .npy for large data.
    """
    try:
        return csvdata.shape(path)
    except csvdata.CsvError as exc:
        raise DataFileError(str(exc)) from None
