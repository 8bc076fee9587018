"""``launch JOB.yaml --detach``: a supervisor that leaves the terminal once the run started.

The command starts itself again without ``--detach`` as the supervisor (``spawn``): its
own session (no terminal's SIGHUP or Ctrl-C reaches it), stdin from /dev/null, and a pipe
back to this command. The supervisor checks and starts exactly as a foreground launch,
its messages on this terminal, then (``Handoff``, once every process started) points its
stdout and stderr at ``RUN_DIR/console.log`` and says so down the pipe; this command
prints the run directory and the commands that reach the run, and exits 0. A start that
fails ends the supervisor before that: this command exits with its exit code.
"""

from __future__ import annotations

import os
import signal
import sys

PIPE_VAR = "PODLAUNCH_DETACH_FD"  # the supervisor's end of the pipe; never a worker's
CONSOLE_FILE = "console.log"


def spawn(argv: list, cwd: str | None = None, quiet: bool = False,
          handed: list | None = None) -> int:
    """Start the supervisor (``argv`` without ``--detach``, handed over in its environment:
    ``ps`` shows no ``--set`` value; in ``cwd``); returns this command's exit code.
    ``quiet``: say nothing once it started, and leave it alone on Ctrl-C (``launch attach``,
    whose Ctrl-C never stops a run, follows it). ``handed``: gets the size of the run's
    ``launcher.log`` (bytes) when the supervisor left this terminal: every line before it was
    shown here, so a follower starts there and shows none twice."""
    import json
    import subprocess  # here: launch --help pays for no import it does not use

    from launcher import owned

    read_fd, write_fd = os.pipe()
    try:  # its arguments in its environment (owner-only in /proc), never in its command line
        child = subprocess.Popen([sys.executable, "-P", "-m", "launcher.cli"],
                                 stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd,
                                 pass_fds=(write_fd,), env={**os.environ, PIPE_VAR: str(write_fd),
                                                            owned.ARGV_VAR: json.dumps(argv)})
    finally:
        os.close(write_fd)
    run_dir, started = None, False
    try:
        with os.fdopen(read_fd, "r", encoding="utf-8", errors="replace") as pipe:
            for line in pipe:
                word, _, rest = line.rstrip("\n").partition(" ")
                if word == "run_dir":
                    run_dir = rest
                elif word == "started":
                    started = True
                    if handed is not None and rest.isdigit():
                        handed.append(int(rest))
        if not started:
            return child.wait()
    except KeyboardInterrupt:  # Ctrl-C before the hand-off: the start is stopped in order
        if not quiet:
            child.send_signal(signal.SIGTERM)
            child.wait()
        raise
    if quiet:
        return 0
    from launcher.console.nextsteps import launch_word

    launch = launch_word()
    try:
        _said_started(child.pid, run_dir, launch)
    except (OSError, ValueError):  # stdout closed or its reader gone (`| head -1`): the run
        devnull = os.open(os.devnull, os.O_WRONLY)  # started all the same, so this exits 0
        os.dup2(devnull, 1)  # (Python's own flush of stdout at exit lands here)
        os.close(devnull)
    return 0


def _said_started(pid: int, run_dir: str, launch: str) -> None:
    print(f"podlaunch: detached: the supervisor (pid {pid}) goes on without this terminal; "
          f"its console: {os.path.join(run_dir, CONSOLE_FILE)}\n"
          f"run directory {run_dir}\n"
          f"  {launch} logs {run_dir} -f    follow it (exits with the run's exit code)\n"
          f"  {launch} attach {run_dir}     its live console view\n"
          f"  {launch} wait {run_dir}       wait for its end (its exit code; --timeout-s SECONDS: 124)\n"
          f"  {launch} stop {run_dir}       stop it in order (an agreed step saved)\n"
          f"  {launch} runs                 its step, loss and ETA", flush=True)


class Handoff:
    """The supervisor's side, when ``PIPE_VAR`` is set: ``run_dir`` once the run directory is
    known, then (a console watcher) the hand-off at the first status refresh, which comes
    once every process started."""

    def __init__(self):
        fd = os.environ.pop(PIPE_VAR, None)
        self.fd = int(fd) if fd and fd.isdigit() else None
        self.run_dir = None

    @property
    def detached(self) -> bool:
        return self.fd is not None

    def _say(self, text: str) -> None:
        try:
            os.write(self.fd, (text + "\n").encode())
        except OSError:  # the command was killed: the run goes on regardless
            pass

    def run_dir_is(self, run_dir: str, console) -> None:
        if self.fd is None:
            return
        self.run_dir, self.console = run_dir, console
        self._say(f"run_dir {run_dir}")
        console.watchers.append(self)

    def __call__(self, tracked, now) -> None:
        """Every process started: the console now goes to ``console.log``."""
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        with self.console._log_lock:  # what launcher.log holds that this terminal has shown
            try:
                shown = os.fstat(self.console.log.fileno()).st_size
            except (AttributeError, OSError, ValueError):
                shown = None
        try:  # O_NOFOLLOW: a link planted in the run directory is not written through
            out = os.open(os.path.join(self.run_dir, CONSOLE_FILE),
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        except OSError:  # launcher.log keeps the messages and the summary regardless
            out = os.open(os.devnull, os.O_WRONLY)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        self._say("started" if shown is None else f"started {shown}")
        os.close(self.fd)
        self.fd = None
        self.console.watchers.remove(self)
