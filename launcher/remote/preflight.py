"""Preflight, run on each host before anything starts anywhere (shipped by source).

Reports the interpreter's version and working directory, the jax and jaxlib
versions, which of ``modules`` cannot be imported (with the cluster's env and
``setup`` applied by the launcher's shell script), whether the coordinator
port is free, and the survivors of an earlier run of the job, stopping them
when asked.

Survivor records: one JSON pid file per process in ``<workdir>/.podlaunch/<job>/``
(written by ``wrapper``). A record counts only on the node that wrote it (a
shared home directory holds several nodes' records) and only while a process
in its group still has ``<run_dir_env>=<run_dir>`` in its environment (pids
are reused; a run's marker is not). A survivor is *stale* only when its
launcher is gone (the wrapper saw its channel end: ``launcher_gone_at``) or
it belongs to this very run (``own_run_dir``: an earlier attempt); one whose
launcher is still connected is another launch of the job running beside this
one (a sweep), reported with ``"live_launch": true`` and never stopped.

Args (one JSON object): ``modules`` (names to find), ``port`` (int: check it
is free, 0 picks a free one; null: no check), ``kill_stale`` (bool: stop every stale
survivor), ``stop_own`` (bool: stop only this run's own),
``grace_s`` (seconds between TERM and KILL), ``state_dir`` (where the pid
files are), ``run_dir_env`` (the env name holding a worker's run dir),
``own_run_dir`` (this run's directory on the host), ``keep_own`` (bool: leave this run's own
alone, a detached run taken back), ``synced`` (the sync manifest's path
relative to the workdir, ``launcher.backends.ssh.syncdir.MANIFEST``, or null: no sync),
``commands`` (a program's command names, looked up on this shell's PATH: after the setup).

Prints ``MARK`` + JSON: ``python``, ``workdir`` (absolute), ``jax``, ``jaxlib``
(None when not installed), ``missing_modules``, ``missing_commands``, ``foreign_worker`` (where a module
named ``worker`` that is not podlaunch's is found first, when ``worker.trainer.main`` is asked:
a user's package on ``PYTHONPATH`` that would run instead; else null), ``port`` or ``port_error``,
``survivors`` (records with ``pids`` still alive and ``stopped`` when stopped), and with
``synced`` asked, ``synced``: ``{"manifest": its text or null, "lstat": {path: [kind, size,
mtime]}}`` for each path the manifest lists (kind "f" a regular file, "d" a directory, "o"
another; mtime in whole seconds, as SFTP gives it; a path that is not there is left out):
what the launcher needs to see that a sync would change nothing without an SFTP request.
"""

import glob
import importlib.util
import json
import os
import platform
import shutil
import socket
import stat
import sys

from launcher import proctl

MARK = "podlaunch-preflight "


def survivors(state_dir, kill, grace_s, run_dir_env, own_run_dir=None, stop_own=False,
              keep_own=False):
    """This node's pid-file records of the job whose group still lives; stops stale ones if
    ``kill``, or only this run's own (``own_run_dir``: an earlier attempt's) if ``stop_own``;
    ``keep_own``: this run's own are never stopped and are marked ``"own": true`` (a supervisor
    taking a detached run back: they are the processes it takes back, not survivors).

    Records of groups that are gone are removed. Returns the records that
    were alive (or stopped now), each with ``pids`` (still alive at the end).
    """
    out = []
    node = socket.gethostname()
    for path in sorted(glob.glob(os.path.join(state_dir, "*.pid"))):
        try:
            with open(path) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if rec.get("node") != node:
            continue
        marker = ("%s=%s" % (run_dir_env, rec["run_dir"])).encode()
        pids = proctl.group_members(rec["pgid"], marker)
        rec["live_launch"] = bool(rec.get("watched") and "launcher_gone_at" not in rec
                                  and rec["run_dir"] != own_run_dir)
        mine = own_run_dir is not None and rec["run_dir"] == own_run_dir
        if keep_own and mine:
            rec["own"] = True
        elif pids and (kill or (stop_own and mine)) and not rec["live_launch"]:
            pids, rec["stopped"] = proctl.stop_group(rec["pgid"], grace_s, marker), True
        rec["pids"] = pids
        if pids or rec.get("stopped"):
            out.append(rec)
        if not pids:
            try:
                os.unlink(path)
            except OSError:
                pass
    return out


def versions(names=("jax", "jaxlib")):
    """{name: installed version or None}, read from package metadata (importing jax takes seconds)."""
    try:
        from importlib.metadata import version
    except ImportError:  # Python < 3.8
        version = None
    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except Exception:  # noqa: BLE001  not installed, or no metadata reader
            out[name] = None
    return out


def missing(modules):
    """The names in ``modules`` that ``importlib`` cannot find."""
    out = []
    for module in modules:
        try:
            if importlib.util.find_spec(module) is None:
                out.append(module)
        except (ImportError, ValueError):
            out.append(module)
    return out


# Files of podlaunch's worker package that a user's own ``worker`` would hardly have
WORKER_FILES = ("contract/__init__.py", "runtime/joining.py", "trainer/main.py")


def foreign_worker():
    """Where the ``worker`` found first lies when it is not podlaunch's (a package without
    ``WORKER_FILES``, or a ``worker.py``), else None; nothing is imported. Searched as the
    workers search (``workdir_last``)."""
    try:
        found = importlib.util.find_spec("worker")
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    places = found.submodule_search_locations
    if places is None:
        return found.origin
    place = list(places)[0]
    if all(os.path.isfile(os.path.join(place, name)) for name in WORKER_FILES):
        return None
    return place


def check_port(port):
    """``{"port": p}`` when ``port`` is free here (0: a free one), else ``{"port_error": why}``
    (in use, refused by bind, or no TCP socket at all on this host: a sandbox)."""
    try:
        if port == 0:
            return {"port": proctl.free_port()}
        error = proctl.bind_error(port)
    except OSError as exc:
        return {"port_error": "cannot be had: this host allows no TCP socket (%s, errno %s)"
                % (os.strerror(exc.errno), exc.errno)}
    return {"port_error": error} if error else {"port": port}


def synced(path):
    """What the sync manifest at ``path`` (relative to the workdir, the sync's target and the
    current directory) lists, and what stands at each of its paths there."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
        listed = json.loads(text)
        paths = set(listed.get("files", {})) | set(listed.get("dirs", {}))
    except (OSError, ValueError, AttributeError, TypeError):
        return {"manifest": None, "lstat": {}}
    found = {}
    for rel in sorted(paths):
        try:
            st = os.lstat("./" + rel)  # as the sync's SFTP requests name it: "<workdir>/<rel>"
        except (OSError, ValueError, TypeError):
            continue
        kind = "f" if stat.S_ISREG(st.st_mode) else "d" if stat.S_ISDIR(st.st_mode) else "o"
        found[rel] = [kind, st.st_size, st[stat.ST_MTIME]]  # whole seconds, as sftp-server's
    return {"manifest": text, "lstat": found}


def workdir_last():
    """``sys.path`` as a worker has it: workers start with ``python -P`` and search the
    working directory last (``worker/__main__.py``), so a user's ``worker.py`` there hides
    nothing and is never imported by the checks here; their task's module is still found."""
    here = ("", ".", os.getcwd())
    sys.path[:] = [p for p in sys.path if p not in here] + [os.getcwd()]


def main(args):
    workdir_last()
    out = {"python": platform.python_version(), "workdir": os.getcwd()}
    out.update(versions())
    out["missing_modules"] = missing(args["modules"])
    out["foreign_worker"] = foreign_worker() if "worker.trainer.main" in args["modules"] else None
    if args["port"] is not None:
        out.update(check_port(args["port"]))
    own = os.path.abspath(args["own_run_dir"]) if args.get("own_run_dir") else None
    out["survivors"] = survivors(args["state_dir"], args["kill_stale"], args["grace_s"],
                                 args["run_dir_env"], own, args.get("stop_own", False),
                                 args.get("keep_own", False))
    if args.get("synced"):
        out["synced"] = synced(args["synced"])
    # a program's command, as the worker's shell will look it up (this shell ran the setup)
    out["missing_commands"] = [c for c in args.get("commands", ()) if shutil.which(c) is None]
    print(MARK + json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
