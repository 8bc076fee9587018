"""The wrapper that runs one worker on a host (shipped by source).

Starts ``argv`` as the leader of a new session, so its process group
outlives the SSH connection (a command without a pty keeps running when its
connection drops) and can be signalled as a whole; records ``{pgid, run_dir,
process_id, node}`` in ``pid_file`` (how the next launch finds survivors);
prints ``PGID_MARK``; waits; kills whatever the worker left in its group;
removes the pid file; prints ``EXIT_MARK`` with the exit code or signal and
the host's clock. sshd reports a signal death as an ``exit-signal`` request
that paramiko drops, so the wrapper says it in-band.

Args (one JSON object): ``argv`` (the worker's command), ``pid_file``,
``run_dir`` (created), ``process_id``.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

from launcher import proctl

PGID_MARK = "podlaunch-pgid "
EXIT_MARK = "podlaunch-exit "


def exit_report(code, at):
    """The ``EXIT_MARK`` payload for a ``Popen.returncode`` (negative: a signal) at time ``at``."""
    return ("signal=%d" % -code if code < 0 else "code=%d" % code) + " at=%.6f" % at


def parse_exit_report(payload):
    """``(code, signal, at)`` from an ``exit_report`` payload; the missing one of code/signal is None."""
    fields = dict(item.partition("=")[::2] for item in payload.split())
    at = float(fields["at"]) if "at" in fields else None
    if "signal" in fields:
        return None, int(fields["signal"]), at
    return int(fields["code"]), None, at


def _say(text):
    try:
        print(text, flush=True)
    except OSError:  # the connection is gone; the worker's fate still matters
        pass


def main(args):
    """Run the worker to its end; return the exit status for the wrapper itself."""
    os.makedirs(os.path.dirname(args["pid_file"]), exist_ok=True)
    os.makedirs(args["run_dir"], exist_ok=True)
    p = subprocess.Popen(args["argv"], start_new_session=True, stdin=subprocess.DEVNULL,
                         stderr=subprocess.STDOUT)
    tmp = args["pid_file"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"pgid": p.pid, "run_dir": args["run_dir"], "process_id": args["process_id"],
                   "node": socket.gethostname()}, f)
    os.replace(tmp, args["pid_file"])
    _say(PGID_MARK + "%d" % p.pid)
    code = p.wait()
    ended_at = time.time()  # the host's clock orders a cascade better than arrival order
    proctl.signal_group(p.pid, (signal.SIGKILL,))  # whatever the worker left in its group
    try:
        os.unlink(args["pid_file"])
    except OSError:
        pass
    _say(EXIT_MARK + exit_report(code, ended_at))
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
