"""A real Ray cluster on this machine for the ray backend's tests: a head and worker nodes, each
a ``ray start --block`` of its own on a loopback address of its own (127.0.0.2, 127.0.0.3;
the head takes the one Ray picks), with small explicit CPU counts and no dashboard.

Each node leads its own process group, so a test can stop one node at once, raylet and every
worker process of it (``stop_node``: SIGKILL, as a machine that is gone), and start it again
(``restore``). ``left`` reads the cluster's own tables (through a short driver of its own)
for what a test must not leave behind: an actor or a placement group still alive.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from harness import ports

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
# a lost node is told within about 10 s (the default: 5 checks 3 s apart, each given 10 s);
# tighter, a node still starting on a busy 2-core machine was taken for lost
SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5,
                 "health_check_timeout_ms": 3000}
# Ray 2.60 turns token authentication on for a head wherever ~/.ray/auth_token exists (a
# local `ray.init()` writes one) but not for a driver that connects: the test cluster, its
# probes and its launches say one mode, whatever the home directory holds
AUTH = {"RAY_AUTH_MODE": "disabled"}
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # Ray's minimum is 75 MiB; the default a third of RAM
PROBE = r"""
import json, logging, sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level=logging.ERROR)
import ray._private.state as state
print("rayenv-probe " + json.dumps({
    "nodes": [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]],
    "groups": [g["name"] for g in ray.util.placement_group_table().values()
               if g["state"] != "REMOVED"],
    "actors": [a.get("Name") or a["ActorID"] for a in state.actors().values()
               if a.get("State") != "DEAD"]}))
"""


HOLD = r"""
import json, logging, sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level=logging.ERROR)
from ray.util.placement_group import placement_group
group = placement_group(json.loads(sys.argv[2]), strategy="SPREAD", name="rayenv-hold")
ray.get(group.ready(), timeout=120)
print("rayenv-held", flush=True)
sys.stdin.read()  # until the test is done: the driver's end removes its group
"""


def available() -> str | None:
    """None when Ray can run here, else why not."""
    if not os.path.exists(RAY):
        return f"no {RAY}: install the test extras (pip install -e '.[test]')"
    return None


class RayTestEnv:
    """A head (``head_cpus``) and ``len(worker_cpus)`` worker nodes, each with its CPUs."""

    def __init__(self, head_cpus: int = 1, worker_cpus: tuple = (2, 2), env: dict | None = None):
        self.head_cpus, self.worker_cpus = head_cpus, tuple(worker_cpus)
        self.env = {**(env if env is not None else os.environ), "RAY_USAGE_STATS_ENABLED": "0",
                    # a node that registers slowly on a busy machine is waited for
                    "RAY_raylet_start_wait_time_s": "120", **AUTH}
        self.temp = tempfile.mkdtemp(prefix="prt-", dir="/tmp")  # short: Ray's socket paths
        self.nodes: dict = {}  # name -> Popen
        self.port = 0
        self.worker_ips = [f"127.0.0.{2 + i}" for i in range(len(self.worker_cpus))]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> "RayTestEnv":
        try:
            with ports.claiming():
                # in the Slurm clusters' range, past their ports (slurmenv: base, +100...)
                self.port = _free_port(ports.first_port(3350, 400, 0))
                self._start("head", ["--head", f"--port={self.port}",
                                     f"--num-cpus={self.head_cpus}", "--include-dashboard=false",
                                     f"--temp-dir={self.temp}",
                                     f"--system-config={json.dumps(SYSTEM_CONFIG)}"])
                self._wait_started("head")
            for ip in self.worker_ips:  # one at a time: two at once overload the GCS of a
                self.start_worker(ip)   # busy 2-core machine
                self._wait_started(ip)
            self.wait_nodes(1 + len(self.worker_ips))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self, name: str, args: list) -> None:
        log = open(os.path.join(self.temp, f"{name}.log"), "ab")
        with log:
            self.nodes[name] = subprocess.Popen(
                [RAY, "start", "--block", "--disable-usage-stats", "--include-log-monitor=false",
                 f"--object-store-memory={OBJECT_STORE_BYTES}",
                 # workers on ports the system picks free: Ray's own range (10002-19999)
                 # holds this checkout's head port in some checkouts (refused at start: 'a
                 # port number ... used by other components') and the suite's sshd ports
                 "--min-worker-port=0", "--max-worker-port=0", *args],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)

    def start_worker(self, ip: str) -> None:
        cpus = self.worker_cpus[self.worker_ips.index(ip)]
        self._start(ip, [f"--address={self.address}", f"--node-ip-address={ip}",
                         f"--num-cpus={cpus}"])

    def _wait_started(self, name: str, timeout_s: float = 300) -> None:
        """Until ``ray start`` of node ``name`` says it runs (read from its log: a driver that
        asks the cluster costs about a CPU-second each time)."""
        path = os.path.join(self.temp, f"{name}.log")
        deadline = time.monotonic() + timeout_s
        while True:
            with open(path, errors="replace") as f:
                if "Ray runtime started" in f.read():
                    return
            assert self.nodes[name].poll() is None, f"node {name} ended:\n{self.logs()}"
            assert time.monotonic() < deadline, f"node {name} not started:\n{self.logs()}"
            time.sleep(0.5)

    def probe(self, tries: int = 3) -> dict:
        """What a driver of its own reads of the cluster; tried again where it could not
        connect (a GCS slow to answer on a busy machine)."""
        for _ in range(tries):
            done = subprocess.run([sys.executable, "-c", PROBE, self.address], env=self.env,
                                  capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                break
            time.sleep(2)
        assert done.returncode == 0, done.stderr[-3000:] + self.logs()
        # Ray prints its cluster's messages on a driver's stdout too
        line = next(l for l in done.stdout.splitlines() if l.startswith("rayenv-probe "))
        return json.loads(line.split(" ", 1)[1])

    def wait_nodes(self, count: int, timeout_s: float = 300) -> list:
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.probe()["nodes"] if self.port else []
            if len(found) == count or time.monotonic() > deadline:
                assert len(found) == count, (found, self.logs())
                return found
            time.sleep(2)

    def left(self) -> dict:
        """The actors and placement groups still alive on the cluster (none after a test)."""
        found = self.probe()
        return {"actors": found["actors"], "groups": found["groups"]}

    @contextlib.contextmanager
    def holding(self, bundles: list):
        """Other work on the cluster: a driver of its own holds a placement group of
        ``bundles`` while the block runs."""
        proc = subprocess.Popen([sys.executable, "-c", HOLD, self.address, json.dumps(bundles)],
                                env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        try:
            assert any(line.startswith("rayenv-held") for line in proc.stdout), "not held"
            yield
        finally:
            proc.stdin.close()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def stop_node(self, ip: str) -> None:
        """The worker node ``ip`` gone at once: its raylet and every process of it SIGKILLed."""
        proc = self.nodes.pop(ip)
        _kill_group(proc)

    def restore(self) -> None:
        """Every worker node a test stopped started again."""
        gone = [ip for ip in self.worker_ips if ip not in self.nodes]
        for ip in gone:
            self.start_worker(ip)
            self._wait_started(ip)
        if gone:
            self.wait_nodes(1 + len(self.worker_ips))

    def logs(self) -> str:
        out = []
        for name in sorted(os.listdir(self.temp)):
            if name.endswith(".log"):
                with open(os.path.join(self.temp, name), errors="replace") as f:
                    out.append(f"--- {name}\n{f.read()[-2000:]}")
        return "\n".join(out)

    def __exit__(self, *exc) -> None:
        for name in [n for n in self.nodes if n != "head"] + ["head"]:
            proc = self.nodes.pop(name, None)
            if proc is not None:
                _kill_group(proc)
        shutil.rmtree(self.temp, ignore_errors=True)


def _free_port(start: int) -> int:
    for port in range(start, start + 50):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port for the test Ray head in {start}-{start + 49}")


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group (a node: ``ray start`` and what it started) and wait
    until none of it is left."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.1)
