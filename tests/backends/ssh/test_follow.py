"""``launcher.remote.follow`` as shipped, on this machine: what a detached ssh or tpu run's
follower does on a host (tests/backends/ssh/test_ssh_adopt.py runs it through sshd)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from launcher import proctl, remote
from launcher.remote import follow


def _follower(tmp_path, args: dict) -> subprocess.Popen:
    """The follower as a host runs it: its shipped source as a file, its JSON in the env."""
    path = tmp_path / "follow.py"
    path.write_text(remote.source("follow"))
    env = {"PATH": os.environ["PATH"], follow.ARGS_VAR: json.dumps(args), follow.TOKEN_VAR: "tok"}
    return subprocess.Popen([sys.executable, "-I", str(path)], env=env, cwd=tmp_path,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _said(output: bytes) -> tuple:
    """(its answer, the bytes after its mark)."""
    before, mark, after = output.partition(f"\n{follow.MARK}tok\n".encode())
    assert mark, output
    return json.loads(before.rpartition(b"\n")[2]), after


def _first_lines(follower: subprocess.Popen) -> bytes:
    """What a live follower printed up to its mark (it goes on: its stdin is open)."""
    got = b""
    while f"{follow.MARK}tok\n".encode() not in got:
        chunk = follower.stdout.read1(65536)
        assert chunk, got
        got += chunk
    return got


def test_a_started_wrapper_writes_into_its_file_from_which_only_its_own_bytes_are_sent(tmp_path):
    out = tmp_path / "output" / "attempt-0" / "process-000.out"
    out.parent.mkdir(parents=True)
    out.write_bytes(b"a stray's line\n")  # an earlier start's: not this worker's
    # the "wrapper": its environment comes on its stdin, its output goes to the file
    wrapper = [sys.executable, "-c", "import json, sys; env = json.load(sys.stdin); "
               "print('worker', env['X'], flush=True)"]
    follower = _follower(tmp_path, {"start": wrapper, "out": str(out), "env": {"X": "1"}})
    output = follower.stdout.read()  # its channel stays open: it ends with its writer
    said, sent = _said(output)
    assert follower.wait(timeout=30) == 0
    assert said["offset"] == len(b"a stray's line\n") and said["pgid"] is None
    assert sent == b"worker 1\n"  # from the offset on, to the file's end once the writer is gone
    assert out.read_bytes() == b"a stray's line\nworker 1\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_a_journaled_wrapper_is_proven_before_it_is_followed_and_its_end_marks_the_pid_file(
        tmp_path):
    out = tmp_path / "p.out"
    out.write_bytes(b"read before\nnot yet read\n")
    writer = subprocess.Popen(["sleep", "60"])
    pid_file = tmp_path / "run.process-000.pid"
    pid_file.write_text(json.dumps({"pgid": 4242, "launcher_gone_at": 1.0}))
    try:
        since = proctl.start_ticks(writer.pid)
        # another start tick: not the journaled process (a reused pid), never taken for it
        other = _follower(tmp_path, {"pid": writer.pid, "since": since + 1, "pgid": writer.pid,
                                     "offset": 12, "out": str(out)})
        said, sent = _said(other.stdout.read())  # not alive: the file to its end, then it ends
        assert (said["alive"], said["pgid"], sent) == (False, None, b"not yet read\n")
        # the journaled one: alive; its group unproven (sleep leads none of its own); followed
        # until its supervisor's channel (stdin) ends, which the pid file is told. A follower a
        # supervisor left before (its channel ends late: a machine that slept) marks nothing.
        args = {"pid": writer.pid, "since": since, "pgid": writer.pid, "offset": 12,
                "out": str(out), "pid_file": str(pid_file)}
        earlier = _follower(tmp_path, args)
        assert _said(_first_lines(earlier))[0]["alive"]
        mine = _follower(tmp_path, args)
        said, _ = _said(_first_lines(mine))
        assert (said["alive"], said["pgid"]) == (True, None)
        record = json.loads(pid_file.read_text())
        assert "launcher_gone_at" not in record and record["follower"] == mine.pid  # a launcher again
        earlier.stdin.close()
        assert earlier.wait(timeout=30) == 0
        assert "launcher_gone_at" not in json.loads(pid_file.read_text())
        mine.stdin.close()
        assert mine.wait(timeout=30) == 0 and writer.poll() is None  # the writer goes on
        assert json.loads(pid_file.read_text())["launcher_gone_at"] > 1.0
    finally:
        writer.kill()
