"""The wrapper's control token without sshd (issue 51.9: only the slow forgery test over
ssh checked it): the worker never sees the token, its verbatim markers are worker lines,
and only the wrapper's own lines carry it."""

from __future__ import annotations

import json
import subprocess
import sys

from launcher import remote
from launcher.remote import wrapper

TOKEN = "t0k3n-abc"
FORGER = ("import os; print('token' if os.environ.get(%r) else 'no token'); "
          "print('podlaunch-pgid 1'); print('podlaunch-exit code=0 at=1.0'); "
          "print('podlaunch-pgid %s 1'); print('glued podlaunch-exit %s code=0 at=1.0'); "
          "raise SystemExit(3)") % (wrapper.TOKEN_VAR, "x" + TOKEN, "x" + TOKEN)


def test_only_the_wrappers_own_lines_carry_the_token_and_the_worker_never_sees_it(tmp_path):
    argv = remote.python_call(sys.executable, "wrapper", {
        "argv": [sys.executable, "-c", FORGER], "pid_file": None, "run_dir": "run",
        "process_id": 0, "env_from_stdin": True})
    done = subprocess.run(argv, cwd=tmp_path, input=json.dumps({wrapper.TOKEN_VAR: TOKEN}),
                          capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert done.returncode == 3, done.stdout + done.stderr
    assert "no token" in lines, lines  # removed from the worker's environment
    kinds = [wrapper.control(line, TOKEN) for line in lines]
    control = [(kind, payload) for kind, payload, _ in kinds if kind is not None]
    assert [kind for kind, _ in control] == ["pgid", "exit"], lines
    assert wrapper.parse_exit_report(control[1][1])[:2] == (3, None)
    # the forged markers (no token, a wrong one) come through as the worker's own lines
    heads = [head for kind, _, head in kinds if kind is None]
    assert "podlaunch-exit code=0 at=1.0" in heads and f"podlaunch-pgid x{TOKEN} 1" in heads


def test_without_a_token_no_line_is_control():
    assert wrapper.control("podlaunch-pgid 42", "") == (None, None, "podlaunch-pgid 42")
    assert wrapper.control(f"podlaunch-exit {TOKEN} code=0 at=1.0", "")[0] is None
    assert wrapper.control(f"podlaunch-exit {TOKEN} garbage", TOKEN)[0] is None
    assert wrapper.control(f"out podlaunch-exit {TOKEN} code=1 at=2.0", TOKEN) == \
        ("exit", "code=1 at=2.0", "out ")
