"""Read the shape of a data file without numpy, so specs are checked before launch.

Only headers are read: the ``.npy`` format header
(https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html), the
member headers inside an ``.npz`` zip, and the line count of a ``.csv``.
"""

from __future__ import annotations

import ast
import struct
import zipfile
from typing import IO

from worker import csvdata

SUFFIXES = (".npy", ".npz", ".csv")


class DataFileError(Exception):
    """The file is missing, unreadable, or not shaped like a dataset."""


def _npy_shape(stream: IO[bytes], name: str) -> tuple[int, ...]:
    magic = stream.read(8)
    if magic[:6] != b"\x93NUMPY":
        raise DataFileError(f"{name} is not an .npy file (bad magic bytes)")
    major = magic[6]
    size_format = "<H" if major == 1 else "<I"
    (header_len,) = struct.unpack(size_format, stream.read(struct.calcsize(size_format)))
    header = ast.literal_eval(stream.read(header_len).decode("latin1"))
    descr = header.get("descr")
    if not isinstance(descr, str) or descr[1:2] not in ("f", "i", "u", "b"):
        raise DataFileError(f"{name} holds dtype {descr!r}; expected numbers (float, int or bool): "
                            "save it with numpy.asarray(a, dtype=numpy.float32)")
    if header.get("fortran_order"):
        raise DataFileError(f"{name} is in Fortran order; save it with C order "
                            "(numpy.ascontiguousarray) so rows can be memory-mapped")
    return tuple(header["shape"])


def shape(path: str) -> tuple[int, int]:
    """Return (num_rows, num_columns) of a dataset file.

    For ``.npz`` files num_columns is the feature count of array ``x`` (the
    targets are array ``y``); for ``.npy`` and ``.csv`` it counts every column,
    target included.

    Raises:
      DataFileError: with a message saying what is wrong with the file.
    """
    try:
        if path.endswith(".npy"):
            with open(path, "rb") as f:
                dims = _npy_shape(f, path)
            if len(dims) != 2:
                raise DataFileError(f"expected a 2-D array [rows, columns], got shape {dims}")
            return dims
        if path.endswith(".npz"):
            with zipfile.ZipFile(path) as archive:
                names = set(archive.namelist())
                if not {"x.npy", "y.npy"} <= names:
                    raise DataFileError(
                        f"expected arrays named 'x' and 'y', found {sorted(n[:-4] for n in names)}; "
                        "save with numpy.savez(path, x=features, y=targets)")
                with archive.open("x.npy") as f:
                    x = _npy_shape(f, "x")
                with archive.open("y.npy") as f:
                    y = _npy_shape(f, "y")
            if len(x) != 2 or x[0] != y[0]:
                raise DataFileError(f"expected x [rows, features] and y [rows, ...] with equal rows, "
                                    f"got x {x} and y {y}")
            return x[0], x[1]
        if path.endswith(".csv"):
            return _csv_shape(path)
    except OSError as exc:
        raise DataFileError(f"cannot read the file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DataFileError("not UTF-8 text; a .csv must be text") from None
    except (zipfile.BadZipFile, ValueError, SyntaxError, KeyError, struct.error) as exc:
        raise DataFileError(f"cannot read the file's header: {exc}") from None
    raise DataFileError(f"expected a file ending in {', '.join(SUFFIXES)}")


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
