"""The one CSV parser: the launcher's pre-check and the workers' reader agree on every cell.

Standard library only (the launcher imports it without numpy). A data file is
comma-separated numbers, one row per line; the first non-empty line may be a
header (a cell that is neither a number nor a missing-value mark: a first row
``1.5,NA,3`` as spreadsheets and databases export it is data, refused for its
missing cell, never skipped as a header). As spreadsheets write them, a
byte-order mark before the first line is dropped and a cell in double quotes
is read without them (``"1.5"``). A cell is a decimal number as
``NUMBER`` writes it, with optional surrounding spaces: ``1_000`` (which
Python's ``float`` accepts and numpy's parser rejects), ``0x10`` and empty
cells are refused, and so are ``nan`` and ``inf`` in any spelling: a
non-finite value would only show up later as a NaN loss, far from its row.
"""

import math
import re

NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max
_NON_FINITE = re.compile(r"[-+]?(?:nan|inf|infinity)", re.IGNORECASE)
# how spreadsheets, R, pandas, SQL dumps and Stata write a missing value
_MISSING = re.compile(r"|na|n/a|#n/a|null|\\n|none|nil|-|\?|\.", re.IGNORECASE)


class CsvError(ValueError):
    """A cell or row that is not data; the message names the line and column (1-based)."""


def _cell(text):
    """A cell, stripped, and unquoted as spreadsheets quote every cell (``"1.5"``)."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1].replace('""', '"').strip()
    return text


def _cells(line):
    return [_cell(cell) for cell in line.rstrip("\r\n").split(",")]


def _is_header(cells):
    return any(not NUMBER.fullmatch(c) and not _NON_FINITE.fullmatch(c) and not _MISSING.fullmatch(c)
               for c in cells)


def parse_row(cells, number, columns):
    """The floats of one data row.

    Args:
      cells: the row's cells, stripped.
      number: its 1-based line number, for messages.
      columns: how many cells every row must have.

    Raises:
      CsvError: a short or long row, a cell that is not a number, a non-finite value.
    """
    if len(cells) != columns:
        raise CsvError("line %d has %d columns, expected %d like the first line"
                       % (number, len(cells), columns))
    values = []
    for index, cell in enumerate(cells):
        if not NUMBER.fullmatch(cell):
            if _NON_FINITE.fullmatch(cell):
                raise CsvError("line %d, column %d: %r is not a finite number; data must be "
                               "finite (fix or drop the row)" % (number, index + 1, cell))
            if _MISSING.fullmatch(cell):
                raise CsvError("line %d, column %d: %r marks a missing value; every cell must "
                               "hold a number (fill it in or drop the row)" % (number, index + 1, cell))
            raise CsvError("line %d, column %d: %r is not a number (write plain decimals, "
                           "e.g. 1000 or 1.5e-3)" % (number, index + 1, cell))
        value = float(cell)
        if not math.isfinite(value):  # 1e999 overflows to inf
            raise CsvError("line %d, column %d: %r is beyond float range" % (number, index + 1, cell))
        if abs(value) > FLOAT32_MAX:  # 1e39: finite here, inf in the float32 batch
            raise CsvError("line %d, column %d: %r is beyond float32's range (+-3.4e38): the "
                           "batch would hold inf and the loss turn NaN" % (number, index + 1, cell))
        values.append(value)
    return values


def data_lines(stream):
    """``(line_number, cells)`` of every data row of an open CSV text stream, header skipped.

    The number of columns is the first non-empty line's; every row is
    checked against it by ``parse_row``.
    """
    first = True
    for number, line in enumerate(stream, start=1):
        if number == 1:
            line = line.lstrip("\ufeff")  # the byte-order mark Excel's "CSV UTF-8" starts with
        if not line.strip():
            continue
        cells = _cells(line)
        if first:
            first = False
            if _is_header(cells):
                continue
        yield number, cells


def shape(path):
    """``(rows, columns)`` of a CSV file, every cell checked (linear in the file's size).

    Raises:
      CsvError: the first bad row or cell, by line and column; an empty file.
      OSError, UnicodeDecodeError: the file cannot be read as UTF-8 text.
    """
    rows, columns = 0, None
    with open(path, "r", encoding="utf-8") as f:
        for number, cells in data_lines(f):
            if columns is None:
                columns = len(cells)
            parse_row(cells, number, columns)
            rows += 1
    if columns is None:
        raise CsvError("the file has no data rows")
    return rows, columns


def read_rows(path, ranges):
    """The parsed rows whose 0-based data-row indices fall in ``ranges`` (``[(start, end), ...]``).

    Only those rows are converted; the others are skimmed. Rows come back in
    the order of ``ranges``.

    Raises:
      CsvError: as ``shape``, for the rows read.
    """
    wanted = {i for start, end in ranges for i in range(start, end)}
    found, columns = {}, None
    with open(path, "r", encoding="utf-8") as f:
        for index, (number, cells) in enumerate(data_lines(f)):
            if columns is None:
                columns = len(cells)
            if index in wanted:
                found[index] = parse_row(cells, number, columns)
    return [found[i] for start, end in ranges for i in range(start, end)]
