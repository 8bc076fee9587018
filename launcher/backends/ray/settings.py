"""The ray backend's cluster settings (``cluster:`` with ``backend: ray``): which Ray cluster,
how many processes, what each reserves in the run's placement group and how the group is
spread over the cluster's nodes. Importing this module imports no Ray.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from launcher import tpu_topology
from launcher.backends.base import ClusterSettings
from launcher.spec import schema
from launcher.spec.schema import port_or_zero
from worker.contract import valuechecks
from worker.contract.sections import setting
from worker.contract.valuechecks import non_negative, positive

# a Ray Client address, a node's GCS address (host:port), or one of the two words
_ADDRESS = re.compile(r"^(ray://[A-Za-z0-9_.:\[\]-]+|[A-Za-z0-9_.-]+:\d{1,5})$")
WORDS = ("local", "auto")
# what a bundle asks of Ray under its own names (``resources`` may not repeat them)
OWN_RESOURCES = ("CPU", "GPU", "TPU", "memory", "object_store_memory")


def check_address(value: str) -> str | None:
    if value in WORDS or _ADDRESS.match(value):
        return None
    return (f"expected local (a Ray head started for the run), auto (the cluster this machine "
            f"is a node of), ray://HOST:PORT (Ray Client) or HOST:PORT (a head's GCS), got "
            f"{value!r}")


def check_resources(resources: dict) -> str | None:
    for name, amount in resources.items():
        if name in OWN_RESOURCES:
            return (f"{name!r} is set by cluster.cpus_per_process, devices_per_process or the "
                    "platform; remove it here")
        if not isinstance(amount, (int, float)) or isinstance(amount, bool) or amount <= 0:
            return f"{name}: expected a number > 0, got {amount!r}"
    return None


def check_tpu_slice(value: str | None) -> str | None:
    return None if value is None else tpu_topology.check_accelerator_type(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayCluster(ClusterSettings):
    """One process per bundle of a placement group on a Ray cluster (``launcher.backends.ray``);
    see docs/ray.md."""

    backend: Literal["ray"] = setting("ray", doc="ray (docs/ray.md)")
    address: str = setting(
        "local", check=check_address,
        doc="the Ray cluster: local (a head started on this machine for the run, stopped at its "
        "end), auto (the cluster this machine is a node of: RAY_ADDRESS, else the newest one "
        "started here), ray://HOST:PORT (Ray Client, e.g. a KubeRay head's port 10001) or "
        "HOST:PORT (a head's GCS address)")
    num_processes: int | None = setting(
        None, check=valuechecks.in_range(1, 1024),
        doc="worker processes, one per bundle of the run's placement group; null: 2, or one "
        "per host of tpu_slice")
    devices_per_process: int | None = setting(
        None, check=valuechecks.in_range(1, 256),
        doc="devices each process sees (cpu: JAX_NUM_CPU_DEVICES; tpu: the TPU chips its "
        "bundle reserves; gpu: its GPUs); null: 2 on cpu, the chips per host of tpu_slice, 1")
    platform: Literal["cpu", "gpu", "tpu"] = setting(
        "cpu", doc="the devices the processes train on (tpu and gpu reserve Ray's TPU and GPU "
        "resources, devices_per_process per bundle)")
    tpu_slice: str | None = setting(
        None, check=check_tpu_slice,
        doc="a TPU slice by its accelerator type (v4-16, v5litepod-16, ...): one process per "
        "host of the slice, each bundle its host's chips, process 0's bundle also the slice's "
        "head resource (TPU-<type>-head), strategy STRICT_SPREAD; needs platform: tpu")
    cpus_per_process: float = setting(1.0, check=non_negative,
                                      doc="Ray CPUs each bundle reserves (logical, as Ray counts)")
    resources: dict[str, float] = setting(
        {}, check=check_resources,
        doc="custom Ray resources each bundle reserves besides CPU, GPU and TPU "
        "({accelerator_type:A100: 0.01, my_label: 1})")
    strategy: Literal["SPREAD", "STRICT_SPREAD", "PACK", "STRICT_PACK"] = setting(
        "SPREAD", doc="how the group's bundles are placed over the nodes (Ray's placement "
        "strategies): SPREAD across nodes where it can, STRICT_SPREAD one per node, PACK and "
        "STRICT_PACK onto as few nodes as it can, or one")
    placement_timeout_s: float = setting(
        120.0, check=positive,
        doc="how long to wait for a group the cluster can hold but not now (a count-down is "
        "shown), before the launch fails")
    namespace: str = setting("podlaunch", check=schema.non_empty,
                             doc="the Ray namespace of the run's actors and placement group")
    coordinator_port: int = setting(0, check=port_or_zero,
                                    doc="JAX coordinator port on process 0's node; 0 picks a "
                                    "free one there")
    grace_s: float = setting(3.0, check=non_negative,
                             doc="after SIGTERM, wait this long before SIGKILL")
    env: dict[str, schema.EnvValue] = setting({}, check=schema.env_names,
                                              doc="extra environment for every worker")

    @property
    def slice(self) -> tpu_topology.Topology | None:
        return None if self.tpu_slice is None else tpu_topology.topology(self.tpu_slice)

    @property
    def num_processes_total(self) -> int:
        if self.num_processes is not None:
            return self.num_processes
        return self.slice.hosts if self.slice is not None else 2

    @property
    def resolved_devices_per_process(self) -> int:
        if self.devices_per_process is not None:
            return self.devices_per_process
        if self.slice is not None:
            return self.slice.devices_per_host
        return 2 if self.platform == "cpu" else 1

    @property
    def placement_strategy(self) -> str:
        return "STRICT_SPREAD" if self.slice is not None else self.strategy

    def bundle(self, process_id: int) -> dict:
        """What process ``process_id``'s bundle reserves, in Ray's resource names."""
        out = {"CPU": self.cpus_per_process} if self.cpus_per_process else {}
        if self.platform == "gpu":
            out["GPU"] = self.resolved_devices_per_process
        if self.platform == "tpu":
            out["TPU"] = self.slice.chips_per_host if self.slice else \
                self.resolved_devices_per_process
            if self.slice is not None and process_id == 0:
                out[f"TPU-{self.tpu_slice}-head"] = 1
        return {**out, **self.resources}

    def problems(self) -> list:
        out = []
        if self.tpu_slice is not None and self.platform != "tpu":
            out.append(("tpu_slice", f"a TPU slice needs platform: tpu (it is "
                        f"{self.platform}); set cluster.platform: tpu"))
        top = self.slice if self.tpu_slice is not None and \
            tpu_topology.check_accelerator_type(self.tpu_slice) is None else None
        if top is not None and self.num_processes not in (None, top.hosts):
            out.append(("num_processes", f"{self.tpu_slice} has {top.hosts} hosts, one process "
                        f"each; got {self.num_processes}: remove it or set {top.hosts}"))
        if not self.bundle(0):
            out.append(("cpus_per_process", "a bundle must reserve something: cpus_per_process "
                        "is 0 and nothing else is asked; set it above 0 or add resources"))
        return out
