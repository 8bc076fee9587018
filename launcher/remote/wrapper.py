"""The wrapper that runs one worker on a host (shipped by source), and locally.

Starts ``argv`` as the leader of a new session, so its process group
outlives the SSH connection (a command without a pty keeps running when its
connection drops) and can be signalled as a whole; records ``{pgid, run_dir,
process_id, node}`` in ``pid_file`` (how the next launch finds survivors);
prints ``PGID_MARK``; waits; kills whatever the worker left behind; removes
the pid file; prints ``EXIT_MARK`` with the exit code or signal and the
host's clock. sshd reports a signal death as an ``exit-signal`` request that
paramiko drops, so the wrapper says it in-band.

Its two control lines share the stream with the worker's own output, so each
carries the launcher's secret ``TOKEN_VAR`` (a fresh random value per
process): ``podlaunch-pgid TOKEN PGID``, ``podlaunch-exit TOKEN code=N at=T``.
The token reaches the wrapper in its environment (ssh: exported by the script
on sshd's stdin) or in the JSON on its stdin (locally), never in a command
line, and the wrapper removes it before the worker starts: a worker that
prints a marker verbatim (a program echoing its input, a dataset, a log it
reads) prints a line without the token, which the launcher treats as any
other worker line (``control``).

Every descendant dies with the worker: the wrapper is a child subreaper
(PR_SET_CHILD_SUBREAPER), so a helper the worker started (a data loader, an
uploader) stays below the wrapper even when it leaves the worker's process
group or session, or its parent dies; once the worker has ended, the wrapper
SIGKILLs its group and every descendant (``proctl.kill_descendants``).

SIGTERM, SIGHUP or SIGINT to the wrapper stops the worker in order: TERM and
CONT to its group, ``grace_s``, then KILL. A wrapper that dies (SIGKILL) takes its
worker with it (PR_SET_PDEATHSIG): no worker trains on unsupervised. With ``parent_pid`` (the local
backend's foreground runs) the wrapper gets SIGTERM when that parent dies (PR_SET_PDEATHSIG),
so even a SIGKILLed launcher leaves nothing behind; a detached run's local wrappers get none,
and write to a file of the run instead of the launcher's pipe (their stdout is that file):
they outlive a killed supervisor until ``launch attach`` takes them back.

Args (one JSON object): ``argv`` (the worker's command), ``pid_file`` (or
null), ``run_dir`` (created), ``process_id``; optional ``cwd`` (where the worker
starts; a program job's directory), ``grace_s`` (default
3), ``parent_pid`` (die with it), ``env_from_stdin`` (read the worker's extra
environment as one JSON object on stdin, so it never shows in a command line
or in the wrapper's own environment), ``watch_stdin`` (over SSH: stdin is the
launcher's channel, kept open for the run; its end means the launcher is gone), ``detached``
(an ssh or tpu host's detached run: its output goes to a file that ``follow`` sends the
supervisor, which keeps the pid file's ``launcher_gone_at`` in its place).

Is its launcher still there? With ``watch_stdin`` the pid file says
``"watched": true``, and the wrapper adds ``"launcher_gone_at"`` (the host's
clock) once stdin ends: the channel closed, because the launcher exited, was
killed or lost the connection. The next launch's preflight reads it: a record
whose launcher is still connected is a live run of the same job beside it (a
sweep), never "stale" (``preflight.survivors``).
"""

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

from launcher import proctl

PGID_MARK = "podlaunch-pgid "
EXIT_MARK = "podlaunch-exit "
# The environment variable that hands the wrapper its control token (removed before
# the worker starts, so the worker never sees it).
TOKEN_VAR = "PODLAUNCH_WRAPPER_TOKEN"
ARGS_VAR = "PODLAUNCH_WRAPPER_ARGS"  # its JSON argument, when not on the command line


def control(line, token):
    """Read one output line against the control ``token``.

    Returns:
      ``(kind, payload, head)``: kind ``"pgid"`` or ``"exit"`` with the marker's
      payload for a line the wrapper wrote (``head``: worker output glued in
      front of it, when the worker's last output had no newline), else
      ``(None, None, line)``: a worker line, whatever it looks like.
    """
    if not token:
        return None, None, line
    pgid = PGID_MARK + token + " "
    if line.startswith(pgid):
        return "pgid", line[len(pgid):], ""
    head, mark, payload = line.rpartition(EXIT_MARK + token + " ")
    if mark:
        try:
            parse_exit_report(payload)
        except (ValueError, KeyError, IndexError):
            return None, None, line
        return "exit", payload, head
    return None, None, line


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


def _write_record(path, record):
    """The pid file, replaced whole (a reader never sees half of it), through a temporary made
    here (O_EXCL, O_NOFOLLOW): a link planted in the run directory is never written through."""
    if not path:
        return
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        os.unlink(tmp)  # one left by a process of this pid before: removed, never followed
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def _stdin_ended():
    """Whether stdin (the launcher's SSH channel) has reached its end; never blocks."""
    try:
        ready, _, _ = select.select([0], [], [], 0)
        return bool(ready) and os.read(0, 65536) == b""
    except (OSError, ValueError):
        return True


def _say(text):
    try:
        print(text, flush=True)
    except OSError:  # the connection is gone; the worker's fate still matters
        pass


def main(args):
    """Run the worker to its end; return the exit status for the wrapper itself."""
    grace_s = float(args.get("grace_s", 3.0))
    parent_pid = args.get("parent_pid")
    if parent_pid is not None:
        proctl.die_with_parent(signal.SIGTERM)
        if os.getppid() != parent_pid:  # the launcher died before the line above
            return 1
    # Run as its own program (``python -c``, ``-m``), the wrapper owns every descendant; a
    # test that calls main() in its own process must not kill the test runner's children.
    own_process = __name__ == "__main__"
    if own_process:
        # the worker inherits this process's mask and ignored signals: as the launcher, the
        # wrapper undoes a runner's (or a host's login's) blocked or ignored SIGTERM first
        proctl.sane_signals()
        proctl.open_files_to_the_hard_limit()  # the host's login may have a low soft limit
        proctl.set_child_subreaper()
        # What the worker writes on a host (its run directory, checkpoints, metrics, the pid
        # file) may hold the job's secrets: owner-only, whatever the login's umask.
        os.umask(0o077)
    env = dict(os.environ)
    if args.get("env_from_stdin"):
        env.update(json.loads(sys.stdin.read() or "{}"))
    token = env.pop(TOKEN_VAR, "")  # the worker never sees it
    marks = {mark: mark + token + " " if token else mark for mark in (PGID_MARK, EXIT_MARK)}
    if args.get("pid_file"):
        os.makedirs(os.path.dirname(args["pid_file"]), exist_ok=True)
    os.makedirs(args["run_dir"], exist_ok=True)
    stop = {"at": None, "killed": False}
    worker = {}

    def on_signal(signum, frame):
        if stop["at"] is None:
            stop["at"] = time.monotonic() + grace_s
            if "p" in worker:
                proctl.signal_group(worker["p"].pid, (signal.SIGTERM, signal.SIGCONT))

    previous = {sig: signal.signal(sig, on_signal)
                for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        p = subprocess.Popen(args["argv"], start_new_session=True, stdin=subprocess.DEVNULL,
                             stderr=subprocess.STDOUT, env=env, cwd=args.get("cwd"),
                             preexec_fn=_die_with_wrapper(os.getpid()))
        worker["p"] = p
        if own_process:  # each orphan that ends is collected at once (SIGCHLD), not per tick
            previous[signal.SIGCHLD] = signal.signal(
                signal.SIGCHLD, lambda signum, frame: _reap_ended_orphans(p.pid))
        if stop["at"] is not None:  # a signal came while it started
            proctl.signal_group(p.pid, (signal.SIGTERM, signal.SIGCONT))
        record = {"pgid": p.pid, "run_dir": args["run_dir"], "process_id": args["process_id"],
                  "node": socket.gethostname()}
        watching = bool(args.get("watch_stdin"))
        if watching or args.get("detached"):  # detached: its follower keeps launcher_gone_at
            record["watched"] = True
        _write_record(args.get("pid_file"), record)
        _say(marks[PGID_MARK] + "%d" % p.pid)
        while True:
            try:
                code = p.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                if own_process:
                    _reap_ended_orphans(p.pid)
                if watching and _stdin_ended():
                    watching = False
                    record["launcher_gone_at"] = time.time()
                    try:
                        _write_record(args.get("pid_file"), record)
                    except OSError:  # a full disk: the record stays "connected", as before
                        pass
                if stop["at"] is not None and not stop["killed"] and time.monotonic() > stop["at"]:
                    stop["killed"] = True
                    proctl.signal_group(p.pid, (signal.SIGKILL,))
                    if own_process:
                        proctl.kill_descendants(os.getpid())
        ended_at = time.time()  # the host's clock orders a cascade better than arrival order
        proctl.signal_group(p.pid, (signal.SIGKILL,))  # whatever the worker left in its group
        if own_process:
            # every descendant (below us even after leaving the group: we are their subreaper)
            proctl.kill_descendants(os.getpid())
            _reap_orphans()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if args.get("pid_file"):
        try:
            os.unlink(args["pid_file"])
        except OSError:
            pass
    _say(marks[EXIT_MARK] + exit_report(code, ended_at))
    return 128 - code if code < 0 else code


def _die_with_wrapper(wrapper_pid):
    """The worker's ``preexec_fn``: SIGKILL when the wrapper dies (PR_SET_PDEATHSIG), on
    every backend. Its own session outlives the connection; without this, a wrapper
    killed on one host (the OOM killer, a user's kill) left its worker training on
    unsupervised to the end, then the run was recorded as failed and restarted."""
    def preexec():
        proctl.die_with_parent(signal.SIGKILL)
        if os.getppid() != wrapper_pid:  # the wrapper died before the line above
            os._exit(1)
    return preexec


def _reap_ended_orphans(worker_pid):
    """Collect the orphans that have ended while the worker runs (a helper the worker
    detached once per step, ``sh -c 'sleep 1 &'``, is ours as the subreaper): without
    this, each stays a zombie until the worker ends, and a long run exhausts the pid
    limit. ``waitid(WNOWAIT)`` looks without reaping, so the worker's own exit status
    is never taken from ``Popen``; no /proc scan per tick."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == worker_pid:
            return  # nothing ended, or the worker itself: Popen.wait takes it
        try:
            os.waitpid(info.si_pid, os.WNOHANG)
        except ChildProcessError:
            return


def _reap_orphans():
    """Collect the zombies of orphans reparented to us (only ours: never another child's)."""
    for pid in proctl.pids():
        fields = proctl.stat_fields(pid)
        if fields is not None and fields[0] == b"Z" and fields[1] == os.getpid():
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


if __name__ == "__main__":
    # over SSH the arguments come in the environment (ARGS_VAR), popped before the worker's
    # environment is made from it: a short command line in the host's ps
    sys.exit(main(json.loads(sys.argv[1] if len(sys.argv) > 1 else os.environ.pop(ARGS_VAR))))
