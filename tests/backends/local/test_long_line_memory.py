"""One long output line costs the launcher constant memory on every backend's reader: the local
backend's pipe (a foreground run) and the output file a detached run's processes write (local
and Slurm read it with ``launcher.remote.tail``); the ssh reader splits with
``lines.LineSplitter`` (tests/backends/ssh/test_ssh_openssh.py). A 64 MiB line cost the local
launcher 268 MiB."""

from __future__ import annotations

import io
import os
import subprocess
import time

import pytest

from harness.helpers import LAUNCH, REPO, env_for_tests
from launcher.console import lines
from launcher.remote import tail

MIB = 1 << 20


def test_a_long_line_in_an_output_file_comes_in_pieces_and_its_offsets_stay_whole(tmp_path):
    path = tmp_path / "out"
    path.write_bytes(b"first\n" + "é".encode() * (8 * MIB) + b"\nlast")  # 16 MiB, a 2-byte char
    got = list(tail.lines(str(path), 0, lambda: False))
    assert got[0] == ("first", 6) and got[-1] == ("last", path.stat().st_size)
    pieces = got[1:-1]
    assert all(end is None for _, end in pieces[:-1]) and pieces[-1][1] == 6 + 16 * MIB + 1
    assert max(len(text.encode()) for text, _ in pieces) <= tail.PIECE_BYTES + tail.CHUNK
    assert "".join(text for text, _ in pieces) == "é" * (8 * MIB)  # no character cut in two
    cut = list(tail.lines(str(path), 6, lambda: False))  # from a line's start, as a take-back
    assert "".join(text for text, end in cut[:-1]) == "é" * (8 * MIB)


def test_a_long_line_on_a_pipe_comes_in_pieces_and_ends_even_without_a_newline():
    stream = io.StringIO("a\n" + "x" * (lines.MAX_HELD_BYTES * 3) + "\nb\n" + "y" * lines.MAX_HELD_BYTES)
    got = list(lines.stream_lines(stream))
    assert got == ["a", "x" * lines.MAX_HELD_BYTES, "x" * lines.MAX_HELD_BYTES,
                   "x" * lines.MAX_HELD_BYTES, "", "b", "y" * lines.MAX_HELD_BYTES, ""]
    assert [isinstance(g, lines.Piece) for g in got] == [False, True, True, True, False, False,
                                                          True, False]  # each long line ends


def _peak_mib(proc: subprocess.Popen, pid_of=lambda proc: proc.pid) -> int:
    """The peak resident memory (VmHWM) of the process ``pid_of(proc)`` while it runs."""
    peak = 0
    while proc.poll() is None:
        try:
            with open(f"/proc/{pid_of(proc)}/status") as f:
                peak = max([peak] + [int(line.split()[1]) // 1024 for line in f
                                     if line.startswith("VmHWM:")])
        except (OSError, ValueError, TypeError):
            pass
        time.sleep(0.05)
    return peak


@pytest.mark.slow  # real workers
def test_a_64_mib_line_costs_the_local_launcher_constant_memory(tmp_path):
    run_dir = tmp_path / "run"
    launched = subprocess.Popen(
        LAUNCH + ["jobs/linear.yaml", "--set", "train.num_steps=50", "--set",
                  "task.name=faulty_task:make", "--set", "task.args.crash_at_step=3",
                  "--set", "task.args.crash_process_id=1", "--set", "task.args.mode=long_line",
                  "--set", "task.args.long_line_mb=64", "--run-dir", str(run_dir)],
        cwd=REPO, env=env_for_tests(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL)
    out = io.BytesIO()
    import threading

    reader = threading.Thread(target=lambda: out.write(launched.stdout.read()), daemon=True)
    reader.start()
    peak = _peak_mib(launched)
    reader.join(30)
    said = out.getvalue().decode(errors="replace")
    assert launched.returncode == 1, said[-3000:]
    assert f"[... line cut: {64 * MIB:,} characters in all, every one in the log file]" in said
    print(f"launcher peak {peak} MiB")
    assert peak < 100, peak
    with open(run_dir / "logs" / "process-001.log", "rb") as f:
        data = f.read()
    start = data.index(b"x" * 1000)
    assert data[start:start + 64 * MIB + 1] == b"x" * (64 * MIB) + b"\n"
    assert os.path.getsize(run_dir / "logs" / "process-001.log") < 65 * MIB
