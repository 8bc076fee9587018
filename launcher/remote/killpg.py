"""Signal one process group on a host (shipped by source; teardown's only tool there).

``os.killpg`` in Python rather than sh's ``kill``: the shells' builtins
disagree on ``--`` and negative pids (dash rejects both).

Args (one JSON object): ``pgid``, and either ``signals`` (names such as
"TERM", "CONT", "KILL", sent in order) or ``grace_s`` (the whole stop
sequence here: TERM and CONT, up to ``grace_s`` seconds, KILL, so a host
reached over a fresh connection needs one call). A group that is gone is
not an error. Prints ``MARK`` + JSON ``{"alive": [pids left]}``.
"""

import json
import sys

from launcher import proctl

MARK = "podlaunch-killpg "


def main(args):
    pgid = int(args["pgid"])
    if args.get("grace_s") is not None:
        alive = proctl.stop_group(pgid, float(args["grace_s"]))
    else:
        proctl.signal_group(pgid, args["signals"])
        alive = proctl.group_members(pgid)
    out = {"alive": alive}
    print(MARK + json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
