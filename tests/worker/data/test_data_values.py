"""Values a file allows and the model does not (issue 25, item 9): checked where the data is
read, named by file, row and column."""

from __future__ import annotations

import numpy as np
import pytest

from worker.contract import csvdata
from worker.data import sources


def test_a_csv_cell_beyond_float32_is_refused_naming_line_and_column():
    with pytest.raises(csvdata.CsvError, match=r"line 3, column 2: '1e39' is beyond float32's range"):
        csvdata.parse_row(["1.0", "1e39"], 3, 2)
    assert csvdata.parse_row(["1.0", "3e38"], 3, 2) == [1.0, 3e38]


def test_a_float64_npy_value_beyond_float32_is_a_data_error(tmp_path):
    table = np.zeros((8, 3))
    table[5, 1] = 1e300
    np.save(tmp_path / "t.npy", table)
    source = sources.NpyTable(str(tmp_path / "t.npy"), -1, "float32")
    source.read(np.arange(0, 4))  # rows without it read fine
    with pytest.raises(sources.DataError, match=r"row 6, column 2: 1e\+300 is beyond float32"):
        source.read(np.arange(4, 8))


def test_labels_outside_the_tasks_classes_are_a_data_error(tmp_path):
    from worker import tasks

    table = np.zeros((6, 3), np.float32)
    table[:, -1] = [0, 1, 2, 1, 3, 0]  # 3 is outside num_classes 3
    np.save(tmp_path / "t.npy", table)
    source = sources.NpyTable(str(tmp_path / "t.npy"), -1, "int32")
    source.read(np.arange(6))  # without a task's class count, any whole label passes
    source.num_classes = tasks.softmax_classifier(num_classes=3).num_classes
    with pytest.raises(sources.DataError, match=r"row 5, column 3: label 3.0 is outside 0..2"):
        source.read(np.arange(6))
    table[4, -1] = -1
    np.save(tmp_path / "t.npy", table)
    source = sources.NpyTable(str(tmp_path / "t.npy"), -1, "int32")
    source.num_classes = 3
    with pytest.raises(sources.DataError, match=r"label -1.0 is outside 0..2"):
        source.read(np.arange(6))


@pytest.mark.parametrize("text", [
    "\ufeff1.5,2,3\n4,5,6\n",            # Excel's "CSV UTF-8": a byte-order mark, no header
    '"1.5","2","3"\n"4","5","6"\n',      # every cell quoted, no header
    '\ufeff"a","b","c"\n1.5,2,3\n4,5,6\n',  # both, with a header: only the header goes
])
def test_a_spreadsheets_csv_keeps_its_first_row(tmp_path, text):
    path = tmp_path / "export.csv"
    path.write_text(text, encoding="utf-8")
    assert csvdata.shape(str(path)) == (2, 3)
    assert csvdata.read_rows(str(path), [(0, 2)]) == [[1.5, 2.0, 3.0], [4.0, 5.0, 6.0]]


def test_a_compressed_member_larger_than_the_hosts_memory_is_refused_before_it_is_read(tmp_path):
    """The worker reads a compressed .npz member whole: one that would not fit in this host's
    available memory is a DataError saying so, not numpy's _ArrayMemoryError traceback."""
    import zipfile

    text = repr({"descr": "<f4", "fortran_order": False, "shape": (1 << 40, 4)}).encode() + b" "
    text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
    with zipfile.ZipFile(tmp_path / "big.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x.npy", b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text
                         + bytes(4096))
    with pytest.raises(sources.DataError, match=r"big.npz: array 'x' is compressed and expands to "
                       r"17,592,186,044,416 bytes, more than this host's available memory"):
        sources.NpzArrays(str(tmp_path / "big.npz"))
