"""One run on a Ray cluster: connect, reserve the run's placement group, one actor per bundle
(``launcher.backends.ray.host.ProcessHost``), each starting its process; teardown leaves no
actor, no group and no process.

The actors and the group belong to the launcher's Ray job (none is detached): Ray kills them
and removes the group when the launcher's driver ends, however it ends (a killed launcher
included), and an actor's end takes its worker with it (the wrapper's PR_SET_PDEATHSIG).
They are named ``podlaunch/<run directory's remote name>[/pN]`` in ``cluster.namespace``, so
``ray list actors`` and ``ray list placement-groups`` say whose they are. With no ``Reattach``,
no process outlives the supervisor (the seam's contract: ``launcher.backends.base.Session``).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import secrets
import sys
import time

from launcher.backends.base import Session
from launcher.backends.ray import placement as placing
from launcher.backends.ray.host import ProcessHost
from launcher.backends.ray.workers import CALL_S, RayWorker, gone_why
from launcher.errors import LaunchError
from launcher.plan import Placement, Plan, describe, remote_run_name
from launcher.words import plural

START_S = 120.0  # an actor that has not answered by then (its worker process not started)


class RaySession(Session):
    def __init__(self, job, run_dir: str, console=None, options=None):
        super().__init__(job, run_dir, console, options)
        self.ray = None
        self.group = None
        self.hosts: list = []  # the actor of each bundle, None until made (again)
        self.facts: list = []  # what each actor said of its node
        self.made = 0  # actors made so far
        self.name = f"podlaunch/{remote_run_name(run_dir)}"
        self.shown = ""  # the dry run's placement lines

    # ---- the cluster -------------------------------------------------------------------
    def _connect(self):
        if self.ray is not None:
            return self.ray
        import ray  # the launcher's only import of Ray: this backend's session

        cluster = self.job.cluster
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a local head asks nothing
        kwargs = {"namespace": cluster.namespace, "log_to_driver": False,
                  "logging_level": logging.ERROR}
        try:
            if cluster.address == "local":
                need = sum(b.get("CPU", 0) for b in placing.bundles(cluster, self.job))
                ray.init(num_cpus=max(1, int(-(-need // 1))), include_dashboard=False, **kwargs)
            else:
                ray.init(address=cluster.address, **kwargs)
        except Exception as exc:  # noqa: BLE001 - Ray's many ways to fail to connect
            raise LaunchError(f"cannot reach the Ray cluster at {cluster.address}: "
                              f"{gone_why(exc)}; start one (`ray start --head` on its first "
                              "node), name a running one in cluster.address, or set "
                              "cluster.address: local for a head of the run's own "
                              "(docs/ray.md)") from None
        # Ray prints its cluster's error messages (a node marked dead, ...) on the driver's
        # stdout from a thread of its own, past the console: they are the console's lines
        from ray._private import worker as driver

        driver.print_to_stdstream = self._ray_said
        self.ray = ray
        return ray

    def _ray_said(self, data: dict, ignore_prefix: bool = False) -> None:
        for text in data.get("lines", ()):
            first = str(text).strip().splitlines()[0] if str(text).strip() else ""
            if first:
                self.console.line("ray", first.split(". This can happen", 1)[0])

    def prepare(self, restart: bool = False) -> tuple[tuple, str]:
        ray, job, cluster = self._connect(), self.job, self.job.cluster
        if self.group is None:
            placing.refuse_impossible(ray, job)  # SpecError: exit 2, nothing reserved
            self.group = placing.reserve(ray, job, self.name, self.console)
            self.hosts = [None] * job.num_processes
        else:
            placing.wait_ready(ray, self.group, job, self.console)
        nodes = placing.bundle_nodes(ray, self.group)
        if self.options.dry_run:
            self.shown = placing.describe(job, self.name, nodes, cluster.address)
            placing.release(ray, self.group)
            self.group = None
            python = sys.executable
            return self._placements([{"node": n, "python": python} for n in nodes]), \
                f"{nodes[0]}:{cluster.coordinator_port}"
        self._make_hosts(ray)
        self.facts = self._preflight(ray)
        first = self.facts[0]
        return self._placements(self.facts), f"{first['node']}:{first['port']}"

    def _make_hosts(self, ray) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote = ray.remote(ProcessHost)
        for i, actor in enumerate(self.hosts):
            if actor is not None:
                try:
                    ray.get(actor.alive.remote(), timeout=CALL_S)
                    continue
                except Exception:  # noqa: BLE001 - gone with its node: made again below
                    pass
            bundle = placing.bundles(self.job.cluster, self.job)[i]
            self.made += 1  # a name of its own: a dead actor's stays taken a while
            self.hosts[i] = remote.options(
                name=f"{self.name}/p{i}-{self.made}", max_concurrency=8, max_restarts=0,
                num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0),
                resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.group, placement_group_bundle_index=i)).remote()

    def _preflight(self, ray) -> list:
        """Every actor's facts, checked against the launcher's: the same Python (major.minor),
        jax, jaxlib and podlaunch, the run directory seen, a coordinator port on process 0's node.

        Raises:
          LaunchError: a node is unfit (each named with its process), or did not answer.
        """
        probe = f".ray-probe-{secrets.token_hex(4)}"
        path = os.path.join(self.run_dir, probe)
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)  # as the launch makes it next
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        try:
            calls = [actor.facts.remote(self.run_dir, probe, self.job.cluster.coordinator_port
                                        if i == 0 else None) for i, actor in enumerate(self.hosts)]
            try:
                facts = ray.get(calls, timeout=START_S)
            except Exception as exc:  # noqa: BLE001
                raise LaunchError(f"the run's Ray actors did not start in {START_S:.0f} s: "
                                  f"{gone_why(exc)}") from None
        finally:
            os.unlink(path)
        problems = [f"process {i} on node {f['node']}: {why}"
                    for i, f in enumerate(facts) for why in unfit(f)]
        if problems:
            raise LaunchError("a node of the Ray cluster cannot run the job:\n  "
                              + "\n  ".join(problems))
        return facts

    def _placements(self, facts: list) -> tuple:
        job = self.job
        return tuple(Placement(host=f["node"], num_processes=1,
                               local_device_count=job.local_device_count,
                               platform=job.cluster.platform, python=f["python"],
                               run_dir=self.run_dir,
                               job_path=os.path.join(self.run_dir, "job.json"),
                               env=dict(job.cluster.env), cwd=job.working_directory)
                     for f in facts)

    # ---- the attempt -------------------------------------------------------------------
    def describe(self, plan: Plan) -> str:
        return self.shown + "\n" + describe(plan)

    def describe_start(self, plan: Plan) -> str:
        cluster = self.job.cluster
        nodes = sorted({f["node"] for f in self.facts})
        each = plural(self.job.local_device_count, f"{cluster.platform.upper()} device"
                      if cluster.platform != "cpu" else "CPU device")
        return (f"starting {plural(plan.num_processes, 'process')} x {each} on the Ray cluster "
                f"at {cluster.address} (placement group {self.name}, "
                f"{cluster.placement_strategy} over {plural(len(nodes), 'node')}: "
                f"{', '.join(nodes)}), coordinator {plan.coordinator_address}")

    def start(self, plan: Plan) -> list:
        ray, grace_s = self.ray, self.job.cluster.grace_s
        calls = [self.hosts[p.process_id].start.remote(p, grace_s) for p in plan.processes]
        try:
            ray.get(calls, timeout=START_S)
        except Exception as exc:  # noqa: BLE001
            for actor in self.hosts:
                try:
                    ray.get(actor.signal.remote("kill"), timeout=CALL_S)
                except Exception:  # noqa: BLE001 - gone already
                    pass
            raise LaunchError(f"a process could not start on the Ray cluster: "
                              f"{gone_why(exc)}") from None
        return [RayWorker(p, self.hosts[p.process_id], self.facts[p.process_id]["node"], ray)
                for p in plan.processes]

    def close(self) -> None:
        ray = self.ray
        if ray is None:
            return
        for actor in self.hosts:
            if actor is not None:
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001 - gone already
                    pass
        self.hosts = [None] * len(self.hosts)
        if self.group is not None:
            placing.release(ray, self.group)
            self.group = None
        ray.shutdown()
        self.ray = None


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def unfit(facts: dict) -> list:
    """Why a node (``ProcessHost.facts``) cannot run the launcher's job: versions that differ
    from this machine's, the run directory unseen, the coordinator port taken."""
    out = []
    here = platform.python_version().rsplit(".", 1)[0]
    there = (facts.get("python_version") or "").rsplit(".", 1)[0]
    if there != here:
        out.append(f"Python {facts.get('python_version')} ({facts.get('python')}), the "
                   f"launcher's {platform.python_version()}: start the node's Ray with the "
                   "launcher's Python")
    for name in ("jax", "jaxlib", "podlaunch"):
        mine, theirs = _version(name), facts.get(name)
        if theirs != mine:
            out.append(f"{name} {theirs or 'not installed'}, the launcher's {mine}: install "
                       "the same in the node's Python")
    if facts.get("run_dir_seen") is False:
        out.append("does not see the run directory (the backend needs a filesystem every node "
                   "shares, as Slurm's): put the run directory on it (--run-dir)")
    if facts.get("port_error"):
        out.append(f"coordinator port: {facts['port_error']}; pick another "
                   "cluster.coordinator_port or use 0")
    return out
