"""``launch tensorboard [JOB | RUN_DIR]``: serve TensorBoard on a free port and print its URL,
which opens on the loss, the job's own metrics (accuracy) and every process's own step time
(``FIRST_VIEW``).

With a job's name (or nothing: the job of the newest run; runs are found as every run
command finds them, ``launcher.rundir.names``)
every run of that job is served side by side, each under a readable name:
when it started, and the settings in which it differs from the job's other
runs (``2026-11-30 10:15:00 optimizer.learning_rate=0.3``). TensorBoard names
a run by its directory under the logdir, so the names are links in a
temporary directory, one per run, to the run's ``tensorboard/`` (removed
when the server stops). A run directory is served alone, under the same
kind of name; any other directory of event files is served as it is.

TensorBoard is optional (``python -m pip install tensorboard``, from any directory);
the launcher never imports it, it runs ``python -m tensorboard.main`` as a
child process, so ``launch --help`` stays instant.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from launcher import flags, interrupts, ports, proctl
from launcher.rundir import names, record, specdiff
from launcher.errors import LaunchError, Problem, SpecError
from launcher.words import pip_install, plural
from worker.contract import profiling

INSTALL = pip_install("tensorboard")  # from any directory (pyproject.toml's extra: a checkout's)
PROFILE_INSTALL = pip_install("xprof")  # TensorBoard's profile plugin
PROFILES_SUFFIX = "profiles"  # "<run name> profiles": where the plugin finds a run's traces
NAME_KEYS = 3  # differing settings named in a run's name, at most
# a run's name in bytes, at most: a file name (255 bytes on Linux) with room for " profiles"
NAME_BYTES = 200


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch tensorboard",
        description="Serve the TensorBoard of every run of a job, or of one run, on a free port and "
                    "print its URL (Ctrl-C stops it).")
    parser.add_argument("run_dir", metavar="JOB | RUN_DIR", nargs="?",
                        help="a job's name (every run of it under runs/, each named by its start "
                             "time and the settings it differs in), a run directory (that run), or "
                             "any directory of event files, e.g. runs/ (as it is); default: every "
                             "run of the newest run's job")
    parser.add_argument("--root", metavar="DIR", default=None, help=names.ROOT_HELP)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; 0.0.0.0 serves every interface)")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: a free one)")
    parser.add_argument("--startup-timeout-s", type=float, metavar="SECONDS", default=60.0,
                        help="wait this long for the server to answer before giving up")
    return parser


def tensorboard_installed() -> bool:
    """Whether ``import tensorboard`` would work in this interpreter (nothing is imported)."""
    try:
        return importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules
        return False


def _safe(text: str) -> str:
    """``text`` as one file name: no separator, no NUL, at most ``NAME_BYTES`` bytes (a run's
    name is a link's name, and a file name longer than 255 bytes cannot be made)."""
    name = text.replace(os.sep, "|").replace("\0", "")
    while len(name.encode("utf-8", "surrogateescape")) > NAME_BYTES:
        name = name[:-2] + "…"
    return name


def _short(value, chars: int = 40) -> str:
    """A setting's value in a run's name: its text, cut to ``chars`` with an ellipsis; a
    setting left to its default (``null`` in the resolved spec) is ``default``."""
    text = "default" if value is None else str(value)
    return text if len(text) <= chars else text[:chars - 1] + "…"


REHEARSAL = "-rehearsal"  # the end of a rehearsal backend's name (run.json's backend)


def run_names(run_dirs: list) -> dict:
    """{run dir: a readable, unique name}: its start time and the settings it differs in.

    A setting differs when the runs do not all have the same value for it (a key some runs
    lack counts). Each run names those of its values that are not the most common one (all of
    them where no value is more common than the others): what it trained, before where
    (``cluster.*`` keys last), at most ``NAME_KEYS``, in key order. So one run among sixteen
    that trained at another learning rate names it, and the others are told apart by what
    they do not share. A rehearsal (run.json's ``backend``: ``tpu-rehearsal``) is called one,
    in place of the ``cluster.*`` settings it differs in.
    """
    import collections

    specs = {d: specdiff.spec_of(d) for d in run_dirs}
    keys = sorted({k for spec in specs.values() for k in spec},
                  key=lambda k: (k.startswith("cluster."), k))
    common = {}
    for k in keys:
        counts = collections.Counter(repr(spec.get(k)) for spec in specs.values()).most_common()
        if len(counts) > 1:  # it differs; None: no value is more common than another
            common[k] = counts[0][0] if counts[0][1] > counts[1][1] else None
    names: dict = {}
    for d in run_dirs:
        run = record.read(d)
        started = run.started.replace("T", " ") or os.path.basename(d)
        rehearsal = run.backend.endswith(REHEARSAL)
        own = [k for k in common if k in specs[d] and repr(specs[d].get(k)) != common[k]
               and not (rehearsal and k.startswith("cluster."))]
        words = ["rehearsal"] if rehearsal else []
        words += [f"{k}={_short(specs[d].get(k))}" for k in own[:NAME_KEYS]]
        name = _safe(" ".join([started, *words]))
        if name in names.values():
            name = _safe(f"{name} ({os.path.basename(d)[:40]})")
        names[d] = name
    return names


def served_runs(target: str | None, root: str | None = None) -> tuple:
    """What to serve for ``JOB | RUN_DIR``: (run dirs to name, or None; a directory, or None; what, in words).

    Runs are found as every run command finds them (``launcher.rundir.names``): under
    ``root``, and where it is not given under ``runs/`` here and in the user's index of runs
    started anywhere. A job's name means every run of it; a run's name (``JOB/STAMP``,
    ``STAMP``) that run.

    Returns:
      ([run dirs], None, words) for a job or a run; (None, directory, words) for any other
      directory of event files, served as it is.

    Raises:
      SpecError: no such job, run or directory (the closest names, where it looked), or no
        run at all.
    """
    indexed, base = root is None, root or "runs"
    if target is None:
        newest = names.find(base, indexed=indexed)
        if not newest:
            raise SpecError([Problem("JOB", None, "", f"no run {names.looked_in(root)}; "
                                     "pass a job's name or the run directory `launch` printed")])
        target = newest[0].job
    elif os.path.isdir(target):
        path = os.path.abspath(target)
        if _is_run(path):
            return [path], None, os.path.join(path, "tensorboard")
        inner = [d for d in sorted(glob.glob(os.path.join(path, "*"))) if _is_run(d)]
        if inner:  # runs/<job>: a job's runs
            return inner, None, f"{plural(len(inner), 'run')} in {path}"
        return None, path, path
    found = names.find(base, target, indexed=indexed) if os.sep not in target else []
    if not found:  # a run's short name, or nothing: the resolver's words
        try:
            run_dir = names.resolve(target, root)
        except SpecError as exc:
            raise SpecError([Problem("JOB | RUN_DIR", None, "", problem.message)
                             for problem in exc.problems]) from None
        return [run_dir], None, os.path.join(run_dir, "tensorboard")
    dirs = [os.path.abspath(r.run_dir) for r in found]
    return dirs, None, f"job {target}, {plural(len(dirs), 'run')} {names.looked_in(root)}"


def _is_run(path: str) -> bool:
    return names.is_run_dir(path) or os.path.isdir(os.path.join(path, "tensorboard"))


def link_runs(run_dirs: list, into: str) -> dict:
    """One link per run in ``into``, named by ``run_names``, to its ``tensorboard/``; {name: run dir}.

    And, for the profile plugin, ``<name> profiles/plugins/profile``: a real directory path
    ending in a link to the run's ``tensorboard/plugins/profile`` (its traces,
    ``worker.contract.profiling``). The plugin finds profile directories with a recursive glob that
    does not enter linked directories, but lists each one's sessions at every request, so
    a trace written after the server started appears too.
    """
    linked = {}
    for run_dir, name in run_names(run_dirs).items():
        events = os.path.join(run_dir, "tensorboard")
        os.symlink(events if os.path.isdir(events) else run_dir, os.path.join(into, name))
        plugins = os.path.join(into, f"{name} {PROFILES_SUFFIX}", "plugins")
        os.makedirs(plugins)
        os.symlink(os.path.join(run_dir, profiling.PLUGIN_DIR), os.path.join(plugins, "profile"))
        linked[name] = run_dir
    return linked


def profile_sessions(run_dirs: list) -> list:
    """The profile sessions (``tensorboard/plugins/profile/<session>``) the runs hold."""
    return [path for run_dir in run_dirs
            for path in sorted(glob.glob(os.path.join(run_dir, profiling.PLUGIN_DIR, "*")))
            if os.path.isdir(path)]


def profile_plugin_installed() -> bool:
    """Whether TensorBoard's profile plugin (xprof) is importable here (nothing is imported)."""
    try:
        return importlib.util.find_spec("xprof") is not None
    except (ImportError, ValueError):
        return False


def profile_note(run_dirs: list | None, installed: bool) -> str | None:
    """What to say of the runs' profiles: where they show, or how to install the plugin
    that shows them; None when there are none."""
    sessions = profile_sessions(run_dirs or [])
    if not sessions:
        return None
    if installed:
        return (f"podlaunch: {plural(len(sessions), 'profile session')} in the Profile tab "
                f"(runs named '... {PROFILES_SUFFIX}/<session>', one host per process)")
    return (f"podlaunch: these runs hold {plural(len(sessions), 'profile session')}, which "
            f"TensorBoard shows with its profile plugin, not installed in {sys.executable}; "
            f"install it with: {PROFILE_INSTALL}, then run this again")


# TensorBoard keeps 1,000 points per scalar tag by default (reservoir sampling), so a run
# with more logged steps shows a sample and a loss spike can vanish (tensorboard #4047).
# A bound far above any run's logged steps keeps every point (the reservoir holds only
# the points there are). Not 0, which its help calls "keep all": with TensorBoard 2.21's
# data server, scalars=0 serves no point at all (measured; images=0 likewise, #5550).
KEEP_EVERY_SCALAR = ("--samples_per_plugin", "scalars=10000000")
# The view the printed URL opens on: the Custom Scalars tab, whose layout the job's process 0
# writes (worker.telemetry.tracker.layout_of: the loss, a task's own metrics such as accuracy, then every process's own step time on
# one chart, one run per process so that each has its colour, then the step time and the
# goodput). TensorBoard's own first tab is the Time Series of every tag in name order, where
# the loss came 7th of 9 groups, after compile_time_s's single point.
FIRST_VIEW = "#custom_scalars"
EVERY_SCALAR = "#timeseries"


def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LaunchError(f"tensorboard exited with code {proc.returncode} before serving {url}; "
                              "its last lines are above")
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
      SpecError: bad RUN_DIR, ``--port`` or ``--startup-timeout-s`` (exit 2); nothing served.
      LaunchError: TensorBoard is not installed, or did not start, or no TCP socket can be
        opened or ``--host`` cannot be reached from here (exit 1).
    """
    args = parser().parse_args(argv)
    flags.check(("--port", args.port, flags.port, "the port to serve on"),
                ("--startup-timeout-s", args.startup_timeout_s, flags.seconds,
                 "how long to wait for the server to answer"))
    run_dirs, logdir, what = served_runs(args.run_dir, args.root)
    if not tensorboard_installed():
        raise LaunchError(f"TensorBoard is not installed in {sys.executable}; install it with: "
                          f"{INSTALL}, then run this again")
    links = None
    if run_dirs is not None:
        links = logdir = tempfile.mkdtemp(prefix="podlaunch-tensorboard-")
        link_runs(run_dirs, links)
    args.profiled = run_dirs
    if not _has_events(run_dirs or [logdir]):  # it would serve an empty page without a word
        print(f"podlaunch: no TensorBoard events in {what} yet (a run with "
              "logging.tensorboard: false writes none, and a run writes its first at its "
              "first logged step); serving anyway: TensorBoard shows them as they come",
              flush=True)
    try:
        return _serve(args, logdir, what)
    finally:
        if links is not None:
            shutil.rmtree(links, ignore_errors=True)  # the links, never what they point to


def _has_events(dirs: list) -> bool:
    """Whether any of ``dirs`` holds a TensorBoard event file (``events.out.tfevents.*``), at
    most three levels down (a run's tensorboard/ and its profile plugin's directories)."""
    for top in dirs:
        for depth in range(4):
            if glob.glob(os.path.join(glob.escape(top), *["*"] * depth, "events.out.tfevents.*")):
                return True
    return False


def _port(args) -> int:
    """``--port``, or a free port; either checked before TensorBoard starts: TensorBoard where
    no socket can be opened ends with a traceback in its log, and one whose address cannot
    be reached (the loopback interface down) serves nothing while we wait out
    ``--startup-timeout-s``.

    Raises:
      LaunchError: no TCP socket can be opened here, or ``--host`` cannot be reached from here.
    """
    what, advice = "TensorBoard's server", "run launch tensorboard where TCP sockets work"
    port = args.port
    if port:
        try:
            proctl.bind_error(port, args.host)  # in use: TensorBoard says so itself
        except OSError as exc:
            raise LaunchError(ports.no_socket(what, args.host, exc, advice)) from None
    else:
        port = ports.free_port(what, args.host, f"pass --port PORT (one allowed here), or {advice}")
    ports.check_reachable(what, args.host, port, "serve on an address this host reaches "
                          "(--host), or run launch tensorboard where the network is up")
    return port


def _serve(args, logdir: str, what: str) -> int:
    port = _port(args)
    shown_host = "localhost" if args.host in ("127.0.0.1", "localhost") else args.host
    url = f"http://{shown_host}:{port}/"
    # Its own process group (TensorBoard starts a data server child) that dies
    # with us; Ctrl-C, SIGTERM and SIGHUP (a closed terminal) all stop it.
    # Its output (start-up chatter, the profile plugin's access log: a line per request) goes
    # to a file, shown only when TensorBoard fails: the console stays quiet otherwise.
    output = tempfile.NamedTemporaryFile(prefix="podlaunch-tensorboard-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-P", "-m", "tensorboard.main", "--logdir", logdir,
                             "--host", args.host, "--port", str(port), *KEEP_EVERY_SCALAR],
                            stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=proctl.die_with_parent)
    output.close()
    # SIGINT too: a launcher started from a background job inherits SIGINT ignored,
    # and Python then never raises KeyboardInterrupt.
    previous = interrupts.install(interrupts.raise_keyboard_interrupt)
    failed = True
    try:
        _wait_ready(f"http://{args.host}:{port}/", proc, args.startup_timeout_s)
        print(f"podlaunch: TensorBoard of {what} at {url}{FIRST_VIEW} (Ctrl-C stops it)",
              flush=True)
        print(f"podlaunch: it opens on the loss, any metric of the job's own (accuracy), then "
              f"each process's own step time, a colour each; every scalar: {url}{EVERY_SCALAR}; "
              f"TensorBoard's own messages: {output.name}", flush=True)
        note = profile_note(args.profiled, profile_plugin_installed())
        if note is not None:
            print(note, flush=True)
        failed = proc.wait() != 0
        return 1 if failed else 0
    except KeyboardInterrupt:
        failed = False
        return 0
    finally:
        interrupts.restore(previous)
        _stop_group(proc)
        _end_output(output.name, failed)


def _end_output(path: str, failed: bool, lines: int = 20) -> None:
    """TensorBoard's output file: its last ``lines`` printed when it failed (the file kept),
    else removed."""
    if not failed:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            tail = f.read().splitlines()[-lines:]
    except OSError:
        return
    print(f"podlaunch: TensorBoard's last lines (all in {path}):", file=sys.stderr)
    for line in tail:
        print(f"  | {line}", file=sys.stderr, flush=True)


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop TensorBoard's process group (it and its data server): TERM, 10 s, KILL."""
    proctl.stop_group(proc.pid, grace_s=10, kill_wait_s=5)
    try:
        proc.wait(timeout=1)  # reap the leader
    except subprocess.TimeoutExpired:
        pass
