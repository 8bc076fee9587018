"""Expected failures without tracebacks (issue 50, item 4): a non-finite loss and a
checkpoint that cannot be used are shown as the worker's sentence, once on the console and in
the summary; the traceback is in the process's log file only, and library chatter (gloo's
start-up lines) stays out of the summary's last lines. Real runs of the local backend."""

from __future__ import annotations

import glob
import re
import shutil

import pytest

from harness.helpers import launch

from worker.contract import wire


def _streamed(out: str) -> list:
    """The worker lines the console streamed (``[pN] ...``), before the summary."""
    head = out.split("FAILED: process_id", 1)[0]
    return re.findall(r"^\[p\d+\] (.*)$", head, re.M)


def _summary(out: str) -> str:
    return out[out.index("FAILED: process_id"):]


def _log_holds_the_traceback(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    begin = text.index(wire.DETAIL_BEGIN)
    assert text.index("Traceback (most recent call last):") > begin
    assert text.index(wire.DETAIL_END) > begin


@pytest.mark.slow
def test_a_non_finite_loss_is_its_sentence_once_and_its_traceback_in_the_log_only(tmp_path):
    run_dir = tmp_path / "run"
    # one process: with two, the other one's collective may break before the launcher stops
    # it, and that traceback (a consequence, not an expected failure) is shown; under load
    # it was, 2 of 2 fresh-clone CI runs side by side (the note of this change says so)
    done = launch("jobs/linear.yaml", "--run-dir", str(run_dir), "--set", "optimizer.learning_rate=100",
                  "--set", "train.num_steps=40", "--set", "logging.log_every_steps=1",
                  "--set", "cluster.num_processes=1")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Traceback" not in out and wire.DETAIL_BEGIN not in out, out
    said = [line for line in _streamed(out) if "FloatingPointError: loss is" in line]
    assert len(said) == 1, out
    assert re.search(r"^  \| failed at step \d+: FloatingPointError: loss is (inf|nan) at step \d+ "
                     r"\(logging.on_nonfinite_loss: stop", _summary(out), re.M), out
    for log in glob.glob(str(run_dir / "logs" / "process-*.log")):
        _log_holds_the_traceback(log)


@pytest.mark.slow
def test_a_checkpoint_that_cannot_be_used_is_its_sentence_once_without_gloo_chatter(tmp_path):
    run_dir = tmp_path / "run"
    settings = ("--set", "train.num_steps=20", "--set", "checkpoint.every_steps=10")
    first = launch("jobs/linear.yaml", "--run-dir", str(run_dir), *settings)
    assert first.returncode == 0, first.stdout + first.stderr
    for state in glob.glob(str(run_dir / "checkpoints" / "step-*" / "state.npz")):
        with open(state, "r+b") as f:  # the manifest's sha256 no longer matches
            f.seek(10)
            f.write(b"garbage")
    shutil.rmtree(run_dir / "local-checkpoints", ignore_errors=True)  # no good copy elsewhere
    done = launch("jobs/linear.yaml", *settings, "--resume", str(run_dir))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Traceback" not in out and wire.DETAIL_BEGIN not in out, out
    said = [line for line in _streamed(out) if line.startswith("worker: every checkpoint in ")]
    assert len(said) == 1 and "is corrupt" in said[0], out
    summary = _summary(out)
    assert "  | worker: every checkpoint in " in summary, out
    logs = glob.glob(str(run_dir / "logs" / "attempt-1" / "process-*.log"))
    assert any("[Gloo]" in open(log, encoding="utf-8").read() for log in logs)  # in the logs only
    assert "Gloo" not in summary, summary
    # the process that failed first holds its traceback, between the markers; another may
    # have been stopped before it met the same checkpoint (under load it was), or while it
    # wrote the same traceback (JAX's client ends a process whose coordinator is gone: seen
    # once, the markers' end cut off in process 1's log)
    first_id = int(re.search(r"FAILED: process_id (\d+)", summary).group(1))
    _log_holds_the_traceback(str(run_dir / "logs" / "attempt-1" / f"process-{first_id:03d}.log"))
