"""What runs inside the run's Ray actor on each bundle (``ProcessHost``): the node's facts for
the preflight, then one worker process under the wrapper, as on this machine
(``launcher.backends.local.worker.LocalWorker``), with its lines kept until the launcher reads
them.

The actor is a plain class made remote by the session (``ray.remote(ProcessHost)``), so this
module imports no Ray at import time. The wrapper dies with the actor's process
(PR_SET_PDEATHSIG) and kills every descendant of the worker: when Ray kills the actor (the run
ends, its launcher dies, the node is lost), nothing of the worker is left.
"""

from __future__ import annotations

import collections
import importlib.metadata
import os
import platform
import socket
import sys
import threading
import time

from launcher import proctl
from launcher.backends.local.worker import LocalWorker

READ_LINES = 2000  # lines handed over in one read at most


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


class ProcessHost:
    """One bundle's process host: ``facts`` (preflight), ``start`` one worker, then ``read``
    its lines and how it ended, ``signal`` it, ``stopped``, ``stacks``, ``profile``."""

    def __init__(self):
        self.worker: LocalWorker | None = None
        self.lines: collections.deque = collections.deque()
        self.ended = threading.Event()
        self.more = threading.Condition()

    def facts(self, run_dir: str, probe: str, port: int | None) -> dict:
        """This node as a worker would see it: its address, Python, jax, where podlaunch is
        imported from, whether the run directory (``probe``: a file the launcher wrote in it) is
        seen here, and, where ``port`` is not None, a coordinator port free here (0: pick one)."""
        import ray  # the actor's own: present wherever it runs

        address = ray.util.get_node_ip_address()
        out = {"node": address, "hostname": socket.gethostname(), "python": sys.executable,
               "python_version": platform.python_version(), "jax": _version("jax"),
               "jaxlib": _version("jaxlib"), "podlaunch": _version("podlaunch"),
               "launcher_path": os.path.dirname(os.path.dirname(proctl.__file__)),
               "node_id": ray.get_runtime_context().get_node_id(),
               "run_dir_seen": os.path.isfile(os.path.join(run_dir, probe))}
        if port is not None:
            try:
                error = proctl.bind_error(port, address) if port else None
                out["port"] = port if port else proctl.free_port(address)
                if error:
                    out["port_error"] = error
            except OSError as exc:
                out["port_error"] = f"no TCP socket here: {exc.strerror}"
        return out

    def start(self, process, grace_s: float) -> int:
        """Start ``process`` (a ``launcher.plan.ProcessPlan``) under the wrapper; its pid."""
        with self.more:  # an attempt before this one left nothing to read
            self.lines, self.ended = collections.deque(), threading.Event()
        self.worker = LocalWorker(process, grace_s)
        threading.Thread(target=self._pump, args=(self.worker, self.lines, self.ended),
                         daemon=True, name="lines").start()
        return self.worker.pid

    def _pump(self, worker: LocalWorker, lines: collections.deque,
              ended: threading.Event) -> None:
        try:
            for line in worker.lines():
                with self.more:
                    lines.append(line)
                    self.more.notify_all()
        finally:
            with self.more:
                ended.set()
                self.more.notify_all()

    def read(self, wait_s: float) -> tuple:
        """``(lines, end)``: the lines not yet read (waiting up to ``wait_s`` for one) and, once
        every line is read and the worker ended, how (a ``launcher.ends.Exit``), else None."""
        with self.more:
            if not self.lines and not self.ended.is_set():
                self.more.wait(wait_s)
            out = [self.lines.popleft() for _ in range(min(len(self.lines), READ_LINES))]
        if out or not self.ended.is_set():
            return out, None
        end = None
        deadline = time.monotonic() + 2.0
        while end is None and time.monotonic() < deadline:
            end = self.worker.poll()
            if end is None:
                time.sleep(0.02)
        return out, end

    def signal(self, how: str) -> None:
        """``terminate`` or ``kill`` the worker's whole group (``LocalWorker``'s)."""
        if self.worker is not None and how == "kill":
            self.worker.kill()
        elif self.worker is not None:
            self.worker.terminate()

    def stopped(self) -> bool:
        return self.worker is not None and self.worker.stopped()

    def stacks(self) -> None:
        if self.worker is not None:
            self.worker.dump_stacks()

    def profile(self, text: str) -> None:
        self.worker.request_profile(text)

    def alive(self) -> bool:
        return True
