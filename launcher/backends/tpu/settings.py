"""The ``cluster:`` settings of the tpu backend, and what they imply.

Plain frozen dataclasses checked by ``launcher.spec.schema``; importing this module
imports no SSH library (the TPU rehearsal uses it on its own).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from launcher import tpu_topology
from launcher.spec import schema
from worker.contract import valuechecks
from launcher.backends.base import ClusterSettings
from launcher.backends.ssh.settings import SshSettings
from launcher.spec.schema import port_or_zero
from worker.contract.sections import setting
from worker.contract.valuechecks import positive
from worker import contract
from worker.contract.address import host_port

DEFAULT_IDENTITY_FILE = "~/.ssh/google_compute_engine"


def _accelerator_type(value: str) -> str | None:
    return tpu_topology.check_accelerator_type(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TpuCluster(SshSettings, ClusterSettings):
    """Cloud TPU VM slices, discovered with gcloud, run over SSH; see docs/tpu.md.

    One process per TPU VM host; process_id = slice_index x hosts_per_slice +
    worker_index (the order JAX's own TPU cluster detection uses).
    """

    backend: Literal["tpu"] = setting("tpu", doc="local, ssh or tpu")
    tpu: str | None = setting(None, check=schema.GCP_NAME, doc="name of one TPU slice")
    slices: tuple[str, ...] = setting((), check=schema.each(schema.GCP_NAME),
                                      doc="names of several TPU slices (multislice), in slice order")
    queued_resource: str | None = setting(None, check=schema.GCP_NAME,
                                          doc="name of a queued resource; its slices, in order")
    zone: str = setting(check=schema.GCP_ZONE, doc="the TPU's zone, e.g. us-central2-b")
    project: str | None = setting(None, check=schema.GCP_PROJECT,
                                  doc="GCP project; unset: gcloud's configured project")
    accelerator_type: str = setting(check=_accelerator_type,
                                    doc="e.g. v4-32; checked against gcloud; gives hosts and chips per slice")
    num_slices: int | None = setting(None, check=valuechecks.in_range(1, 1024),
                                     doc="queued_resource only: slices it holds (default 1)")
    ip: Literal["internal", "external"] = setting(
        "internal", doc="connect to networkEndpoints[].ipAddress (internal) or .accessConfig.externalIp")
    identity_file: str | None = setting("~/.ssh/google_compute_engine", check=valuechecks.LOCAL_PATH,
                                        doc="private key tried first (gcloud's key); used only if it exists")
    platform: Literal["cpu", "gpu", "tpu"] = setting("tpu", doc="the platform the workers must report")
    local_device_count: int | None = setting(
        None, check=valuechecks.in_range(1, 256),
        doc="devices each host's process sees; unset: JAX devices per host of accelerator_type")
    coordinator_port: int | None = setting(
        None, check=port_or_zero,
        doc="JAX coordinator port on slice 0 worker 0; unset: JAX's TPU default for the hosts' jax "
        "(8482 since jax 0.8.1, 8476 before); 0 picks a free one")
    megascale_port: int = setting(8080, check=valuechecks.in_range(1, 65535),
                                  doc="multislice: MEGASCALE_PORT, the DCN port between slices")
    cluster_detection_method: Literal["deactivate", "gcetpu"] = setting(
        "deactivate", doc="deactivate: the launcher gives every process its id; gcetpu: JAX reads it "
        "from TPU metadata (the worker still checks it against the plan)")
    stop_other_tpu_holders: bool = setting(
        False, doc="also stop processes not started by podlaunch that hold the TPU devices")
    tpu_device_paths: tuple[str, ...] = setting(("/dev/accel*", "/dev/vfio/*"),
                                                check=schema.each(valuechecks.LOCAL_PATH),
                                                doc="globs of the TPU device files checked for holders")
    libtpu_lockfile: str = setting("/tmp/libtpu_lockfile", check=schema.REMOTE_PATH,
                                   doc="libtpu's lock file; removed when stale (no holder left)")
    gcloud: str = setting("gcloud", check=schema.COMMAND, doc="the gcloud CLI (found on PATH)")
    gcloud_timeout_s: float = setting(60.0, check=positive, doc="each gcloud call must answer within this")

    def problems(self) -> list:
        """Cross-field problems as (key, message) pairs."""
        given = [k for k in ("tpu", "slices", "queued_resource") if getattr(self, k)]
        out = []
        if len(given) != 1:
            out.append(("tpu", "expected exactly one of tpu (one slice), slices (a list) or "
                        f"queued_resource, got {', '.join(given) if given else 'none'}"))
        if self.num_slices is not None and not self.queued_resource:
            out.append(("num_slices", f"only used with queued_resource; the slice count is "
                        f"{max(1, len(self.slices))} here; remove it"))
        first: dict = {}
        for i, name in enumerate(self.slices):
            j = first.setdefault(name, i)
            if j != i:  # one slice's hosts would be placed twice
                out.append((("slices", i), f"{name!r} is listed twice (cluster.slices[{j}] and "
                            f"cluster.slices[{i}]); list each slice once"))
        return out

    @property
    def slice_count(self) -> int:
        return len(self.slices) or self.num_slices or 1

    @property
    def hosts_per_slice(self) -> int:
        return tpu_topology.topology(self.accelerator_type).hosts

    @property
    def devices_per_process(self) -> int:
        return self.local_device_count or tpu_topology.topology(self.accelerator_type).devices_per_host

    @property
    def num_processes_total(self) -> int:
        return self.slice_count * self.hosts_per_slice




def slice_env(cluster: TpuCluster, process_id: int, coordinator_ip: str) -> dict:
    """Environment of one TPU worker beyond the launcher's contract.

    Multislice (https://cloud.google.com/tpu/docs/multislice-introduction): every
    worker gets MEGASCALE_COORDINATOR_ADDRESS (slice 0 worker 0, ``ip:megascale_port``),
    MEGASCALE_NUM_SLICES, MEGASCALE_SLICE_ID and MEGASCALE_PORT; a single slice gets none.
    """
    env = {contract.CLUSTER_DETECTION_METHOD: cluster.cluster_detection_method}
    if cluster.slice_count > 1:
        env.update({
            "MEGASCALE_COORDINATOR_ADDRESS": host_port(coordinator_ip, cluster.megascale_port),
            "MEGASCALE_NUM_SLICES": str(cluster.slice_count),
            "MEGASCALE_SLICE_ID": str(process_id // cluster.hosts_per_slice),
            "MEGASCALE_PORT": str(cluster.megascale_port),
        })
    return env
