"""What one node says about itself before a job's processes join: versions and a free port.

Standard library only, and runnable alone (the slurm backend ships its source
to every node as ``python -c`` for a program job, whose processes are not this
package's worker). The built-in worker prints the same facts itself as its
first line (``wire.Facts``), so Slurm runs no separate probe step.

The facts: the node's name, its Python version and executable, and the
``jax`` and ``jaxlib`` versions (read from package metadata, without importing
jax); on the coordinator's node also ``port``: the wanted coordinator port
checked free by binding it (0: a free one picked by the kernel), or
``port_error`` when it cannot be bound, as ``launcher.proctl`` checks a port
locally.
"""

import errno
import json
import os
import platform
import socket
import sys


def version(name):
    """``name``'s installed version, or None when it is not installed (or its metadata is broken)."""
    try:
        from importlib import metadata
        return metadata.version(name)
    except Exception:
        return None


def port_answer(wanted):
    """{"port": p} with ``wanted`` (or, for 0, a free port) bindable here, else {"port_error": ...}.

    For 0 the port is picked at random below the kernel's ephemeral range
    (``ip_local_port_range``), as ``launcher.proctl.free_port`` picks one (this module runs
    alone on a node, so it does not import it): a port bind(0) hands out lies in the range
    every outgoing connection on the node draws its local port from, and in the seconds before
    process 0 binds it one can take it (a CI run's Slurm job failed so: "Failed to add port to
    server"). bind(0) only where no port below the range is free.
    """
    if wanted == 0:
        import random
        try:
            with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
                low = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            low = 32768  # Linux's default
        first, rng = max(1024, low - 12000), random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(first, max(first + 1, low))
            if "port_error" not in _bind(port):
                return {"port": port}
    return _bind(wanted)


def _bind(port):
    """Only EADDRINUSE is "in use": any other errno (no TCP socket at all in a sandbox, EPERM
    of a seccomp filter) is said with its meaning, as ``launcher.proctl.bind_error`` says it."""
    try:
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError as exc:
                what = ("port %d is in use" % port if exc.errno == errno.EADDRINUSE else
                        "port %d cannot be bound here" % port)
                return {"port": port,
                        "port_error": "%s (%s, errno %s)" % (what, _meaning(exc), exc.errno)}
            return {"port": s.getsockname()[1]}
    except OSError as exc:
        return {"port": port, "port_error": "this node allows no TCP socket (%s, errno %s): a "
                "sandbox or locked-down host" % (_meaning(exc), exc.errno)}


def _meaning(exc):
    return os.strerror(exc.errno) if exc.errno else str(exc)


def facts(coordinator_port=None):
    """This node's facts; ``coordinator_port`` (an int) on the coordinator's node only."""
    answer = {"node": os.environ.get("SLURMD_NODENAME") or platform.node(),
              "python": platform.python_version(), "executable": sys.executable,
              "jax": version("jax"), "jaxlib": version("jaxlib")}
    if coordinator_port is not None:
        answer.update(port_answer(coordinator_port))
    return answer


def main(argv):
    """The probe step: one task per node; the first node of the step checks the port (argv[1])."""
    first = os.environ.get("SLURM_NODEID", "0") == "0"
    wanted = int(argv[1]) if len(argv) > 1 else 0
    print(json.dumps(facts(wanted if first else None)), flush=True)


if __name__ == "__main__":
    main(sys.argv)
