"""Taking a detached local run back (``launcher.backends.local.adopt``), one process at a time:
what proves a journaled process the run's, and where the new supervisor reads its output and
writes its log from. Real processes and files, no workers (tests/commands/test_adopt.py runs
the whole take-back with real workers)."""

from __future__ import annotations

import os
import subprocess
import time

from launcher import owned, proctl
from launcher.backends.local import adopt as localadopt
from launcher.plan import ProcessPlan
from launcher.remote import wrapper
from launcher.ends import Exited, Lost


def _plan(run_dir) -> ProcessPlan:
    return ProcessPlan(process_id=0, host="localhost", local_device_count=1, argv=("x",), env={},
                       log_path=str(run_dir / "logs" / "process-000.log"), run_dir=str(run_dir))


def _adopted(run_dir, record: dict):
    plan = _plan(run_dir)
    [worker] = localadopt.adopt(type("P", (), {"processes": [plan]})(),
                                [{"process_id": 0, "token": "tok", **record}])
    return worker


def _until(check, what: str, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_journaled_pid_is_the_runs_only_at_its_recorded_start_tick(tmp_path, monkeypatch):
    """A process that shows the run's secret but started at another tick than the journal
    says (the pid reused since, by a process that inherited the secret) is not taken back:
    it is reported lost and never signalled; at its recorded tick the same process is taken
    back (alive)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    secret = owned.run_secret(str(run_dir), "n", os.urandom(32))
    monkeypatch.setenv(owned.SECRET_VAR, secret)
    # a process of this user's that carries the run's secret: everything but its start tick
    # proves it the run's
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        _until(lambda: proctl.cmdline(sleeper.pid) == "sleep 60"
               and owned.shows_run(sleeper.pid, secret), "the sleep started")
        since = proctl.start_ticks(sleeper.pid)
        record = {"pid": sleeper.pid, "pgid": sleeper.pid, "offset": 0}
        assert _adopted(run_dir, {**record, "since": since}).poll() is None  # the run's, alive
        other = _adopted(run_dir, {**record, "since": since + 1})
        assert other.pgid is None
        other.terminate()
        other.kill()
        assert list(other.lines()) == []
        ended = other.poll()
        assert isinstance(ended, Lost) and "ended without an exit report" in ended.why, ended
        assert sleeper.poll() is None  # never signalled
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_take_back_cuts_the_log_to_the_journaled_size_and_reads_the_output_from_its_offset(
        tmp_path):
    """The killed supervisor had taken the output file's first line (``offset``) and logged it
    (``logged``: the log's size then), and had written part of a line more to the log: the log
    is cut back to what was logged, and the output read again from the offset, so that each
    line is in the log once, whole."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    out = run_dir / "output" / "attempt-0" / "process-000.out"
    out.parent.mkdir(parents=True)
    out.write_text("step 1\nstep 2\nstep 3\n" + wrapper.EXIT_MARK + "tok "
                   + wrapper.exit_report(0, 5.0) + "\n")
    log = run_dir / "logs" / "process-000.log"
    log.write_text("[process 0] step 1\n[process 0] st")  # the last line cut off by the kill
    gone = subprocess.Popen(["true"])
    gone.wait()  # the wrapper: ended while no supervisor watched
    worker = _adopted(run_dir, {"pid": gone.pid, "since": 1, "pgid": None,
                                "offset": len("step 1\n"),
                                "logged": len("[process 0] step 1\n")})
    assert log.read_text() == "[process 0] step 1\n"
    assert list(worker.lines()) == ["step 2", "step 3"]
    assert worker.poll() == Exited(0, at=5.0)
    assert worker.read_to == out.stat().st_size
