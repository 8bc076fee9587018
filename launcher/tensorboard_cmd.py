"""``launch tensorboard [RUN_DIR]``: serve a run's TensorBoard on a free port and print its URL.

TensorBoard is an optional extra (``pip install -e '.[tensorboard]'``);
the launcher never imports it, it runs ``python -m tensorboard.main`` as a
child process, so ``launch --help`` stays instant.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request

from launcher import proctl
from launcher.errors import LaunchError, Problem, SpecError

INSTALL = "pip install -e '.[tensorboard]'"  # the extra in pyproject.toml, from a checkout


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch tensorboard",
        description="Serve the TensorBoard of a run on a free port and print its URL (Ctrl-C stops it).")
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                        help="a run directory (its tensorboard/ is served) or any directory of event "
                             "files, e.g. runs/ to compare runs; default: the newest run under runs/")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; 0.0.0.0 serves every interface)")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: a free one)")
    parser.add_argument("--startup-timeout-s", type=float, default=60.0,
                        help="wait this long for the server to answer before giving up")
    return parser


def tensorboard_installed() -> bool:
    """Whether ``import tensorboard`` would work in this interpreter (nothing is imported)."""
    try:
        return importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules
        return False


def newest_run(root: str = "runs") -> str | None:
    """The most recently modified ``runs/<job>/<timestamp>`` directory, or None."""
    runs = [d for d in glob.glob(os.path.join(root, "*", "*")) if os.path.isdir(d)]
    return max(runs, key=os.path.getmtime) if runs else None


def logdir_for(run_dir: str | None) -> str:
    """The directory TensorBoard should read for ``RUN_DIR`` (absolute).

    Raises:
      SpecError: no run directory given and none under runs/, or it does not exist.
    """
    if run_dir is None:
        run_dir = newest_run()
        if run_dir is None:
            raise SpecError([Problem("RUN_DIR", None, "", f"no run under {os.path.abspath('runs')}; "
                                     "pass the run directory `launch` printed")])
    run_dir = os.path.abspath(run_dir)
    if not os.path.isdir(run_dir):
        raise SpecError([Problem("RUN_DIR", None, "", f"{run_dir} is not a directory; pass the run "
                                 "directory `launch` printed")])
    events = os.path.join(run_dir, "tensorboard")
    return events if os.path.isdir(events) else run_dir


def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LaunchError(f"tensorboard exited with code {proc.returncode} before serving {url}; "
                              "its output is above")
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise LaunchError(f"tensorboard did not answer at {url} within {timeout_s:g}s "
                      "(raise --startup-timeout-s?)")


def main(argv: list[str]) -> int:
    """Serve until Ctrl-C; returns the exit code (0 after Ctrl-C, 1 if the server died).

    Raises:
      SpecError: bad RUN_DIR (exit 2).
      LaunchError: TensorBoard is not installed, or did not start (exit 1).
    """
    args = _parser().parse_args(argv)
    logdir = logdir_for(args.run_dir)
    if not tensorboard_installed():
        raise LaunchError(f"TensorBoard is not installed in {sys.executable}; install it with: "
                          f"{INSTALL}  (or: pip install tensorboard)")
    port = args.port or proctl.free_port(args.host)
    shown_host = "localhost" if args.host in ("127.0.0.1", "localhost") else args.host
    url = f"http://{shown_host}:{port}/"
    # Its own process group (TensorBoard starts a data server child) that dies
    # with us; Ctrl-C, SIGTERM and SIGHUP (a closed terminal) all stop it.
    proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", logdir,
                             "--host", args.host, "--port", str(port)],
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=proctl.die_with_parent)
    # SIGINT too: a launcher started from a background job inherits SIGINT ignored,
    # and Python then never raises KeyboardInterrupt.
    previous = {sig: signal.signal(sig, _interrupt)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        _wait_ready(f"http://{args.host}:{port}/", proc, args.startup_timeout_s)
        print(f"podlaunch: TensorBoard of {logdir} at {url} (Ctrl-C stops it)", flush=True)
        return 0 if proc.wait() == 0 else 1
    except KeyboardInterrupt:
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop_group(proc)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop TensorBoard's process group (it and its data server): TERM, 10 s, KILL."""
    proctl.stop_group(proc.pid, grace_s=10, kill_wait_s=5)
    try:
        proc.wait(timeout=1)  # reap the leader
    except subprocess.TimeoutExpired:
        pass
