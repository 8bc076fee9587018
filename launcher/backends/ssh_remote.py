"""The small Python programs the ssh backend runs on each host, and their shell wrapper.

Both programs run under the cluster's remote ``python`` with only the standard
library (the launcher must not need jax; the hosts have it, but importing it
costs seconds). Each takes one JSON argument and prints one marked line, so a
host's login banner or ``setup`` chatter cannot be mistaken for an answer.

``PREFLIGHT`` reports versions, importability, the coordinator port and any
survivors of an earlier run of the job (killing them when asked).
``WRAPPER`` starts the worker as the leader of a new session (so its process
group outlives the SSH connection and can be signalled as a whole), records
``{pgid, run_dir, process_id, node}`` in a pid file, prints ``PGID_MARK``,
waits, and prints ``EXIT_MARK`` with the exit code or signal: sshd reports a
signal death as an ``exit-signal`` request that paramiko drops, so the wrapper
says it in-band.
"""

from __future__ import annotations

import json
import shlex

PREFLIGHT_MARK = "podlaunch-preflight "
PGID_MARK = "podlaunch-pgid "
EXIT_MARK = "podlaunch-exit "

# Survivor records: one JSON pid file per process in <workdir>/.podlaunch/<job>/.
# A record counts only on the node that wrote it (a shared home directory
# holds several nodes' records) and only while a process in its group still
# has PODLAUNCH_RUN_DIR=<run_dir> in its environment (pids are reused).
_SURVIVORS = r'''
def _group(pgid, run_dir):
    needle = ("PODLAUNCH_RUN_DIR=" + run_dir).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z" or int(fields[2]) != pgid:
                continue
            with open("/proc/%s/environ" % entry, "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def survivors(state_dir, kill, grace_s):
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
        pids = _group(rec["pgid"], rec["run_dir"])
        if pids and kill:
            for sig in (signal.SIGTERM, signal.SIGCONT):
                try:
                    os.killpg(rec["pgid"], sig)
                except OSError:
                    pass
            deadline = time.time() + grace_s
            while time.time() < deadline and _group(rec["pgid"], rec["run_dir"]):
                time.sleep(0.05)
            if _group(rec["pgid"], rec["run_dir"]):
                try:
                    os.killpg(rec["pgid"], signal.SIGKILL)
                except OSError:
                    pass
            deadline = time.time() + 5
            while time.time() < deadline and _group(rec["pgid"], rec["run_dir"]):
                time.sleep(0.05)
            pids, rec["stopped"] = _group(rec["pgid"], rec["run_dir"]), True
        rec["pids"] = pids
        if pids or rec.get("stopped"):
            out.append(rec)
        if not pids:
            try:
                os.unlink(path)
            except OSError:
                pass
    return out
'''

PREFLIGHT = r'''
import glob, importlib.util, json, os, platform, signal, socket, sys, time
''' + _SURVIVORS + r'''
a = json.loads(sys.argv[1])
out = {"python": platform.python_version(), "workdir": os.getcwd()}
try:
    from importlib.metadata import version, PackageNotFoundError
except ImportError:
    version = None
for name in ("jax", "jaxlib"):
    try:
        out[name] = version(name)
    except Exception:
        out[name] = None
missing = []
for module in a["modules"]:
    try:
        if importlib.util.find_spec(module) is None:
            missing.append(module)
    except (ImportError, ValueError):
        missing.append(module)
out["missing_modules"] = missing
port = a["port"]
if port is not None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # as JAX's coordinator (gRPC) does: a closed run's TIME_WAIT must not count as in use
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
        out["port"] = s.getsockname()[1]
    except OSError as exc:
        out["port_error"] = "port %d is in use (%s)" % (port, exc.strerror)
    finally:
        s.close()
out["survivors"] = survivors(a["state_dir"], a["kill_stale"], a["grace_s"])
print("''' + PREFLIGHT_MARK + r'''" + json.dumps(out), flush=True)
'''

WRAPPER = r'''
import json, os, signal, socket, subprocess, sys, time
a = json.loads(sys.argv[1])
os.makedirs(os.path.dirname(a["pid_file"]), exist_ok=True)
os.makedirs(a["run_dir"], exist_ok=True)
p = subprocess.Popen(a["argv"], start_new_session=True, stdin=subprocess.DEVNULL,
                     stderr=subprocess.STDOUT)
tmp = a["pid_file"] + ".tmp"
with open(tmp, "w") as f:
    json.dump({"pgid": p.pid, "run_dir": a["run_dir"], "process_id": a["process_id"],
               "node": socket.gethostname()}, f)
os.replace(tmp, a["pid_file"])
try:
    print("''' + PGID_MARK + r'''%d" % p.pid, flush=True)
except OSError:
    pass
code = p.wait()
ended_at = time.time()  # the host's clock orders a cascade better than arrival order
try:
    os.killpg(p.pid, signal.SIGKILL)  # whatever the worker left in its group
except OSError:
    pass
try:
    os.unlink(a["pid_file"])
except OSError:
    pass
try:
    print("''' + EXIT_MARK + r'''" + ("signal=%d" % -code if code < 0 else "code=%d" % code)
          + " at=%.6f" % ended_at, flush=True)
except OSError:
    pass
sys.exit(128 - code if code < 0 else code)
'''

KILLPG = r'''
import json, os, sys
a = json.loads(sys.argv[1])
for name in a["signals"]:
    try:
        os.killpg(a["pgid"], getattr(__import__("signal"), "SIG" + name))
    except OSError:
        pass
'''


def script(workdir: str, setup: tuple, env: dict, argv: list) -> str:
    """A POSIX sh script: enter ``workdir`` (created), run ``setup``, export ``env``, exec ``argv``.

    The backend feeds it to ``sh -s`` on stdin rather than as the SSH command
    line, so env values (secrets included) never show in the host's process
    list, and it works whatever the login shell is. Every value is
    ``shlex.quote``d; ``setup`` lines are shell by design and go in as written.
    """
    lines = ["set -e", f"mkdir -p -- {shlex.quote(workdir)}", f"cd -- {shlex.quote(workdir)}"]
    lines += list(setup)
    lines += [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n"


def python_call(python: str, program: str, args: dict) -> list:
    """argv running ``program`` under ``python`` with ``args`` as its one JSON argument."""
    return [python, "-c", program, json.dumps(args)]
