"""A detached run's worker output on its host, followed for a supervisor (shipped as a file).

A detached run's worker must outlive its supervisor and lose nothing while none reads: so on
an ssh or tpu host its wrapper does not write into the supervisor's SSH channel but into a
file of the run, ``<remote run dir>/output/attempt-N/process-NNN.out`` (0600, its folders
0700), and this program, the channel's command, sends the supervisor what that file gets.
The supervisor counts the bytes it has taken, which are the file's (``offset`` and on), so
the one that takes the run back (``launch attach``) starts a follower of its own where the
killed one's journal says it had read to: every line reaches the process's log once.

Two uses (its JSON argument in the environment, ``ARGS_VAR``, popped at once):

- ``start`` (the wrapper's argv): opens the output file (append, never through a link),
  starts the wrapper in its own session (no terminal, no SIGHUP; stdin a pipe that carries
  the worker's environment, ``env``, then ends; stdout and stderr that file: no SIGPIPE when
  the channel goes), and follows the file from its size before (what an earlier start left
  in it is not this worker's).
- ``pid``, ``since`` (and ``pgid``): a supervisor taking the run back; the wrapper is proven
  the journaled one (this user's, started at that tick, not a zombie) and the worker's group
  the wrapper's own child leading its group, before the supervisor signals anything; the
  file is followed from ``offset``.

Either way it first prints a line of JSON, ``{"pid", "since", "offset", "alive", "pgid"}`` (pgid:
the proven group, or null), and the line ``MARK TOKEN`` (``TOKEN``: the wrapper's control
token, from ``wrapper.TOKEN_VAR``: no login banner or ``setup`` output can forge it), then the file's bytes from ``offset`` as they come, while the wrapper
lives, and to the file's end once it is gone. When its stdin ends or its stdout breaks (the
supervisor is gone), it writes ``launcher_gone_at`` into the wrapper's pid file (``pid_file``:
the next launch's preflight then sees a run without its launcher) and exits; a follower that
takes the run back clears it and becomes the record's (``mark_record``).
"""

import json
import os
import select
import subprocess
import sys
import time

from launcher import proctl

MARK = "podlaunch-follow "
ARGS_VAR = "PODLAUNCH_FOLLOW_ARGS"
TOKEN_VAR = "PODLAUNCH_WRAPPER_TOKEN"  # wrapper.TOKEN_VAR (programs import nothing but proctl)
SECRET_VAR = "PODLAUNCH_RUN_SECRET"  # launcher.owned.SECRET_VAR: carried by a detached run
POLL_S = 0.05
CHUNK = 1 << 16


def alive(pid, since):
    """Whether ``pid`` is still the process started at tick ``since``, this user's, not a zombie."""
    fields = proctl.stat_fields(pid)
    if fields is None or fields[0] == b"Z" or since is None:
        return False
    try:
        if os.stat("/proc/%d" % pid).st_uid != os.getuid():
            return False
    except OSError:
        return False
    return proctl.start_ticks(pid) == since


def shows_run(pid):
    """Whether ``pid`` shows the run's secret in its environment, where this follower carries
    one (``SECRET_VAR``: a detached run's): asked once, when a journaled wrapper is taken back,
    so that a process of the user's that a journal names, or another run's, is never taken for
    it (a process's environment is read as it stands, never while it starts: no race with an
    exec)."""
    secret = os.environ.get(SECRET_VAR)
    return not secret or ("%s=%s" % (SECRET_VAR, secret)).encode() in proctl.environ(pid)


def own_group(pid, pgid):
    """``pgid`` when it is ``pid``'s child leading its own group, else None."""
    if pgid is None:
        return None
    fields = proctl.stat_fields(int(pgid))
    if fields is None or fields[1] != pid or fields[2] != int(pgid):
        return None
    return int(pgid)


def mark_record(path, pgid, gone):
    """Set (``gone``) or clear ``launcher_gone_at`` in the wrapper's pid file ``path`` when it is
    there and names ``pgid``; replaced whole through a temporary of its own (never a link).
    Clearing makes this follower the record's (``follower``): one that a supervisor left
    earlier and that sees its channel end late (a machine that slept) marks nothing."""
    if not path:
        return
    try:
        with open(path) as f:
            record = json.load(f)
        if pgid is not None and record.get("pgid") != pgid:
            return
        if gone and record.get("follower") not in (None, os.getpid()):
            return
        if gone:
            record["launcher_gone_at"] = time.time()
        else:
            record.pop("launcher_gone_at", None)
            record["follower"] = os.getpid()
        tmp = "%s.follow-%d" % (path, os.getpid())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except (OSError, ValueError, AttributeError):
        pass  # gone meanwhile (the wrapper ended), or unreadable: nothing to say


def start(args):
    """Start the wrapper writing into ``args["out"]``; ``(pid, since, offset, child)``."""
    os.umask(0o077)
    folder = os.path.dirname(args["out"])
    os.makedirs(folder, mode=0o700, exist_ok=True)
    out = os.open(args["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                  0o600)
    try:
        os.fchmod(out, 0o600)  # owner-only whoever made it: it may hold the job's secrets
        offset = os.fstat(out).st_size
        child = subprocess.Popen(args["start"], stdin=subprocess.PIPE, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        os.close(out)
    try:
        child.stdin.write(json.dumps(args.get("env") or {}).encode())
        child.stdin.close()
    except OSError:  # it died at once: its output file says how
        pass
    return child.pid, proctl.start_ticks(child.pid), offset, child


def _gone():
    """Whether the supervisor is gone: its channel (stdin) ended; never blocks."""
    try:
        ready, _, _ = select.select([0], [], [], 0)
        return bool(ready) and os.read(0, CHUNK) == b""
    except (OSError, ValueError):
        return True


def _send(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def main(args):
    token = os.environ.get(TOKEN_VAR, "")
    child = None
    if args.get("start"):
        pid, since, offset, child = start(args)
        pgid = None
    else:
        pid, since, offset = int(args["pid"]), args.get("since"), int(args.get("offset") or 0)
        if alive(pid, since) and not shows_run(pid):
            since = None  # not provably the run's: never signalled, never waited on
        pgid = own_group(pid, args.get("pgid")) if alive(pid, since) else None

    def living():
        if child is not None and child.poll() is not None:  # reaped: not a zombie of ours
            return False
        return alive(pid, since)

    answer = {"pid": pid, "since": since, "offset": offset, "alive": living(), "pgid": pgid}
    try:
        mark_record(args.get("pid_file"), pgid, gone=False)
        _send(("\n%s\n%s%s\n" % (json.dumps(answer), MARK, token)).encode())
        fd = os.open(args["out"], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        os.lseek(fd, offset, os.SEEK_SET)
        ending = False
        while True:
            chunk = os.read(fd, CHUNK)
            if chunk:
                _send(chunk)
                continue
            if ending:
                return 0
            if not living():
                ending = True  # what it wrote just before it ended is sent first
                continue
            if _gone():
                raise BrokenPipeError("the supervisor's channel ended")
            time.sleep(POLL_S)
    except OSError:  # the supervisor is gone (or the file is): the worker goes on
        record = None
        try:
            with open(args.get("pid_file") or "") as f:
                record = json.load(f)
        except (OSError, ValueError):
            pass
        if isinstance(record, dict):
            mark_record(args["pid_file"], record.get("pgid"), gone=True)
        return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(os.environ.pop(ARGS_VAR))))
