"""The rule for a data file's values, one for the launcher's check before start
(``launcher.spec.datafiles.check_values``) and the workers' as they read batches
(``worker.data.sources.check_finite``), so the two say the same words: every value of a float
array finite, and finite in float32 (a float64 ``1e300`` would be inf in the batch); rows and
columns counted from 1, as a CSV's lines and columns are (``worker.contract.csvdata``).

numpy is imported by ``first_bad`` itself, when it runs: the contract stays importable without it.
"""

from __future__ import annotations

from worker.contract.csvdata import FLOAT32_MAX


def first_bad(values, rows, what: str = "") -> str | None:
    """Words for the first value of ``values`` (a numpy array, one row per entry of ``rows``:
    the file's 0-based row indices) that is not finite, or not finite in float32; None when
    every value is (or the array holds no floats). ``what`` leads the words (``array 'x', ``).
    """
    import numpy as np  # only where data is checked: a launch without such data never pays

    if not np.issubdtype(values.dtype, np.floating):
        return None
    flat = values.reshape(len(values), -1)
    bad = ~np.isfinite(flat)
    if values.dtype.itemsize > 4:  # float64: finite here can still be inf as float32
        with np.errstate(invalid="ignore"):
            bad |= np.abs(flat) > FLOAT32_MAX
    if not bad.any():
        return None
    index, column = (int(v) for v in np.argwhere(bad)[0])
    value = float(flat[index, column])
    why = ("is beyond float32's range (+-3.4e38): the batch would hold inf" if np.isfinite(value)
           else "is not a finite number; data must be finite (fix or drop the row)")
    return f"{what}row {int(rows[index]) + 1}, column {column + 1}: {value!r} {why}"
