"""The test helpers' own promises: a wait on a process's output fails at its deadline."""

import subprocess
import sys
import time

import pytest

from harness.helpers import Output

SILENT = "import time; print('started', flush=True); time.sleep(120)"


def test_a_silent_process_fails_the_wait_at_its_deadline_not_at_pytests_timeout():
    proc = subprocess.Popen([sys.executable, "-c", SILENT], stdout=subprocess.PIPE, text=True)
    try:
        out = Output.of(proc)
        assert out.wait_for("^started", 30) == "started\n"
        began = time.monotonic()
        with pytest.raises(pytest.fail.Exception, match=r"no line matching 'never' \(x1\) within 1 s"):
            out.wait_for("never", 1)
        with pytest.raises(pytest.fail.Exception, match="did not end within 1 s"):
            out.finish(1)
        assert time.monotonic() - began < 10
        assert Output.of(proc) is out  # one reader per process
    finally:
        proc.kill()
        proc.wait()


def test_output_that_ends_early_fails_the_wait_at_once():
    proc = subprocess.Popen([sys.executable, "-c", "print('only line')"], stdout=subprocess.PIPE, text=True)
    out = Output.of(proc)
    with pytest.raises(pytest.fail.Exception, match="the output ended before a line matching 'never'"):
        out.wait_for("never", 60)
    assert out.finish(30) == (0, "only line\n")


def test_a_supervision_loop_that_never_ends_fails_in_fake_time_not_at_pytests_timeout(tmp_path):
    # issue 25, item 12: a broken copy whose loop never ends hung fake-clock tests until
    # pytest's timeout (120-300 s of CI each); the fake clock's limit fails it at once
    from harness.fakes import FakeClock, FakeWorker, process_plan
    from launcher.run import supervise
    from launcher.console import NullConsole

    clock = FakeClock(limit_s=600)
    worker = FakeWorker(clock, process_plan(0, str(tmp_path)), exit=None)  # runs until stopped
    began = time.monotonic()
    with pytest.raises(AssertionError, match="a loop that never ends"):
        supervise.supervise([worker], grace_s=1, console=NullConsole(), clock=clock,
                            sleep=clock.sleep)
    assert time.monotonic() - began < 30  # a bound against a hang, not a timing
    assert clock.now > 600
