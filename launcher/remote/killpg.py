"""Signal one process group on a host (shipped by source; teardown's only tool there).

``os.killpg`` in Python rather than sh's ``kill``: the shells' builtins
disagree on ``--`` and negative pids (dash rejects both).

Args (one JSON object): ``pgid`` (or ``pgids``, a list), and either
``signals`` (names such as "TERM", "CONT", "KILL", sent in order; none just
asks; with ``"leader": true`` to the group's leader alone) or ``grace_s`` (the
whole stop sequence here: TERM and CONT, up to ``grace_s`` seconds, KILL, so a
host reached over a fresh connection needs one call); optional ``wait_s`` (with
``signals`` to whole groups, not ``leader``: after every group is signalled, up
to that many seconds in all for them to be gone, so a SIGKILLed worker no longer
runs when the answer comes: under load a JAX process takes a moment to exit). A
group that is gone is not an error. Prints ``MARK`` + JSON
``{"alive": [pids left], "stopped": [pgids whose leader is stopped]}``
(stopped: ``/proc/PGID/stat`` state T or t, SIGSTOP or a tracer, after the
signals; what the stall watchdog asks of a host).
"""

import json
import sys

from launcher import proctl

MARK = "podlaunch-killpg "


def main(args):
    pgids = [int(p) for p in args["pgids"]] if "pgids" in args else [int(args["pgid"])]
    alive = []
    signalled = []
    for pgid in pgids:
        if args.get("grace_s") is not None:
            alive += proctl.stop_group(pgid, float(args["grace_s"]))
        elif args.get("leader"):
            proctl.signal_pid(pgid, args["signals"])
        else:
            proctl.signal_group(pgid, args["signals"])
            signalled.append(pgid)
    if signalled and args.get("wait_s"):  # every group signalled first: one wait for all
        proctl.wait_until(lambda: not any(proctl.group_members(p) for p in signalled),
                          float(args["wait_s"]))
    for pgid in signalled:
        alive += proctl.group_members(pgid)
    out = {"alive": alive, "stopped": [p for p in pgids if proctl.is_stopped(p)]}
    print(MARK + json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
