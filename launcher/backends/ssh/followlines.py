"""The launcher's side of a detached run's follower on an ssh or tpu host
(``launcher.remote.follow``): the start script that runs it, and its first line read.

A detached run's worker writes its output into a file on its host; the follower, the SSH
channel's command, starts its wrapper (or, for a supervisor that takes the run back, proves
the journaled one) and sends that file's bytes from an offset. Its first line names the
wrapper, its group when proven, and the offset the next byte is at.
"""

from __future__ import annotations

import json
import os
import socket

import paramiko

from launcher import plan as planning
from launcher import owned, remote
from launcher.backends.ssh import connection
from launcher.backends.ssh.connection import Host
from launcher.backends.ssh.preflight import state_dir
from launcher.remote import follow, wrapper


def script(host: Host, plan: planning.Plan, placement: planning.Placement, process_id: int,
           files: tuple, env: dict, token: str) -> tuple:
    """``(argv, files, env)`` of a start script that runs ``launcher.remote.follow`` (its file
    among ``files``): only the cluster's environment, the token, a detached run's secret and
    ``env`` are exported (the worker's own goes to its wrapper on a pipe: the follower, which
    lives as long, is no process of the run by its run directory)."""
    argv, program = remote.script_call(placement.python, state_dir(host.workdir, plan.job.name),
                                       "follow")
    writer = f"{socket.gethostname()}-{os.getpid()}-{host.index}-f{process_id}"
    # a detached run's secret (``owned.carry_run_secret``): the follower proves a wrapper by it
    # before it signals anything, and the wrapper it starts inherits it
    secret = {owned.SECRET_VAR: os.environ[owned.SECRET_VAR]} \
        if os.environ.get(owned.SECRET_VAR) else {}
    return argv, files + (program + (writer,),), {**placement.env, wrapper.TOKEN_VAR: token,
                                                    **secret, **env}


def first_line(chan: paramiko.Channel, token: str, timeout_s: float) -> tuple:
    """Read ``chan`` past the follower's first lines: its answer (JSON) and its mark.

    Returns:
      ``(what it said, before, after)``: its JSON (``pid``, ``since``, ``offset``, ``alive``,
      ``pgid``), what came before it (a login banner, ``setup``'s words, the job file's
      written mark; ending with a newline, or empty) and the file's first bytes after it.

    Raises:
      OSError: the output ended first, or nothing came for ``timeout_s`` seconds (the
        message quotes the end of what came: a shell's reason).
    """
    before, after = connection.read_past(chan, f"{follow.MARK}{token}", timeout_s, parts=True,
                                         what="its wrapper started")
    head, _, line = before.rpartition(b"\n")
    try:
        said = json.loads(line)
    except ValueError:
        raise OSError(f"said {line[-200:]!r} before its wrapper started") from None
    return said, head + (b"\n" if head and not head.endswith(b"\n") else b""), after
