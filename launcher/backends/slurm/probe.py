"""Runs on every node of the job (one srun task per node) before the workers start.

Standard library only; shipped as its source (``python -c``). Prints one JSON
line: the node's Python and JAX versions (read from package metadata, without
importing jax), and on the first node the coordinator port, free or checked
free there, as ``launcher.proctl`` checks it locally. Argument: the wanted
port (0: pick one).
"""

import json
import os
import platform
import socket
import sys


def version(name):
    try:
        from importlib import metadata
        return metadata.version(name)
    except Exception:  # not installed, or metadata broken
        return None


def port_answer(wanted):
    with socket.socket() as s:
        try:
            s.bind(("", wanted))
        except OSError as exc:
            return {"port": wanted, "port_error": exc.strerror or str(exc)}
        return {"port": s.getsockname()[1]}


def main(argv):
    answer = {"node": os.environ.get("SLURMD_NODENAME") or platform.node(),
              "python": platform.python_version(), "executable": sys.executable,
              "jax": version("jax"), "jaxlib": version("jaxlib")}
    if os.environ.get("SLURM_NODEID", "0") == "0":
        answer.update(port_answer(int(argv[1]) if len(argv) > 1 else 0))
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(sys.argv)
