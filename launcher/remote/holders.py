"""Find, and when asked stop, processes holding a host's TPU (shipped by source).

Holders are found by reading ``/proc/*/fd`` (never by name): any process
with one of the device files (globs) or libtpu's lock file open. Processes
of other users are only visible to root; they are counted as unreadable.

Args (one JSON object): ``globs`` (TPU device files), ``lockfile``,
``stop_others`` (stop the holders: TERM, ``grace_s``, KILL), ``dry_run``
(stop nothing, remove nothing), ``grace_s``, ``port`` (int: check it is
free; null: no check), ``run_dir_env`` (the env name marking a podlaunch
worker), ``spare_run_dirs`` (podlaunch run dirs of live launches: never stopped).

Prints ``MARK`` + JSON: ``holders`` (``pid``, ``paths``, ``cmd``,
``podlaunch_run_dir``) left at the end, ``unreadable``, ``stopped`` (pids),
``lockfile`` (None, "held", "stale" in a dry run, or "removed"), and
``port_error`` when the port is taken.
"""

import glob
import json
import os
import sys

from launcher import proctl

MARK = "podlaunch-tpu-holders "


def describe(pid, held, run_dir_env):
    """What is known of holder ``pid``: its command, the paths it holds, its podlaunch run dir."""
    prefix = (run_dir_env + "=").encode()
    run_dir = next((item[len(prefix):].decode(errors="replace")
                    for item in proctl.environ(pid) if item.startswith(prefix)), None)
    return {"pid": pid, "paths": sorted(held), "cmd": proctl.cmdline(pid),
            "podlaunch_run_dir": run_dir}


def main(args):
    paths = set(os.path.realpath(p) for g in args["globs"] for p in glob.glob(g))
    lock = os.path.realpath(args["lockfile"])
    me = os.getpid()

    def holders():
        return proctl.open_files(paths | {lock}, skip_pid=me)

    found, unreadable = holders()
    out = {"holders": [describe(p, h, args["run_dir_env"]) for p, h in sorted(found.items())],
           "unreadable": unreadable, "stopped": [], "lockfile": None}
    spare = set(args.get("spare_run_dirs") or ())
    targets = [h["pid"] for h in out["holders"] if h["podlaunch_run_dir"] not in spare]
    if targets and args["stop_others"] and not args["dry_run"]:
        proctl.stop_pids(targets, args["grace_s"], lambda: holders()[0])
        left = holders()[0]
        out["stopped"] = [h["pid"] for h in out["holders"] if h["pid"] not in left]
        out["holders"] = [describe(p, h, args["run_dir_env"]) for p, h in sorted(left.items())]
    if os.path.exists(lock):
        # libtpu's lock outlives a killed holder; removing it while held would let two
        # processes drive the same chips, so only a file nobody has open goes.
        if any(lock in h["paths"] for h in out["holders"]):
            out["lockfile"] = "held"
        elif args["dry_run"]:
            out["lockfile"] = "stale"
        else:
            try:
                os.unlink(lock)
            except FileNotFoundError:  # another host sharing this path removed it first
                pass
            out["lockfile"] = "removed"
    if args["port"] is not None:
        try:
            error = proctl.bind_error(args["port"])
        except OSError as exc:
            error = "cannot be had: this host allows no TCP socket (%s, errno %s)" % (
                os.strerror(exc.errno), exc.errno)
        if error:
            out["port_error"] = error
    print(MARK + json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
