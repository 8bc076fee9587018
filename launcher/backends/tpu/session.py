"""The tpu backend's session: discover the slices with gcloud, then run over SSH.

Composition, not a rewritten job: the discovered addresses become host specs
for the ssh backend's ``SshHosts`` (with the ``TpuCluster``'s own SSH
settings), one process per TPU VM host, placements slice-major so that
``make_plan`` numbers processes as JAX's TPU cluster detection does
(jax/_src/clusters/cloud_tpu_cluster.py). With several slices every worker
also gets ``MEGASCALE_COORDINATOR_ADDRESS`` (slice 0, worker 0),
``MEGASCALE_NUM_SLICES``, ``MEGASCALE_SLICE_ID`` and ``MEGASCALE_PORT``
(``settings.slice_env``).
"""

from __future__ import annotations

import dataclasses
import os

from launcher import plan as planning
from launcher import tpu_topology
from launcher.backends.base import Session
from launcher.backends.ssh import adoption, preflight
from launcher.backends.ssh.runhosts import SshHosts
from launcher.backends.ssh.settings import SshHost
from launcher.backends.tpu import discovery as discovering
from launcher.backends.tpu import holders
from launcher.backends.tpu.settings import DEFAULT_IDENTITY_FILE, TpuCluster, slice_env
from launcher.words import plural
from worker.contract.address import host_port


def ssh_settings(cluster: TpuCluster) -> TpuCluster:
    """The cluster's SSH settings as used: gcloud's key only when it exists here."""
    if cluster.identity_file == DEFAULT_IDENTITY_FILE and not os.path.exists(
            os.path.expanduser(DEFAULT_IDENTITY_FILE)):
        # no gcloud key here: ssh_config and ssh-agent still apply
        return dataclasses.replace(cluster, identity_file=None)
    return cluster


class TpuSession(Session):
    """Discovery, then the SSH machinery over the discovered hosts, then the TPU holders."""

    def __init__(self, job, run_dir: str, console=None, options=None):
        super().__init__(job, run_dir, console, options)
        self.reattach = adoption.SshReattach(lambda: self.ssh, self.console)
        self.ssh: SshHosts | None = None

    def hosts_of(self, found: discovering.Discovery) -> SshHosts:
        """The SSH side of the discovered hosts: one process each, slice-major."""
        return SshHosts(self.job, ssh_settings(self.job.cluster),
                        [SshHost(host=h.address) for h in found.hosts], [1] * len(found.hosts),
                        self.run_dir, self.console, self.options.detached)

    def slice_envs(self, count: int, coordinator_ip: str) -> list:
        """Per placement (one process each, so its index is the process id make_plan gives)."""
        return [slice_env(self.job.cluster, index, coordinator_ip) for index in range(count)]

    def prepare(self, restart: bool = False) -> tuple[tuple, str]:
        job, cluster, dry_run = self.job, self.job.cluster, self.options.dry_run
        found = discovering.discover(job)
        self.end_attempt()
        self.ssh = self.hosts_of(found)
        labels = self.ssh.labels(self.ssh.resolve())
        self.console.say(f"discovered {plural(len(found.slices), 'slice')} x "
                         f"{plural(cluster.hosts_per_slice, 'host')} with gcloud:\n{found.table(labels)}")
        if self.options.adopting and not restart:
            # a detached run taken back (launch attach): its own processes hold the chips and
            # the port; nothing of theirs is checked or stopped
            placements, address, _ = adoption.reconnect(
                self.ssh, cluster.coordinator_port, lambda ip: self.slice_envs(len(found.hosts), ip))
            return placements, address
        # this job's survivors (recorded in pid files) are stopped without asking; a dry
        # run stops nothing and reports them
        checks = self.ssh.connect(preflight.REPORT if dry_run else preflight.STOP,
                                  port=cluster.coordinator_port)
        if cluster.coordinator_port is None:
            port = tpu_topology.jax_coordinator_port(checks[0].facts.get("jax"))
        else:
            port = checks[0].facts["port"]
        ours = preflight.survivors_found(checks)
        if ours:  # said before the holder check, which may refuse
            ids = ", ".join(f"p{r['process_id']} (pgid {r['pgid']})" for r in ours)
            self.console.say(f"stopped {plural(len(ours), 'stale process group')} of an earlier run: {ids}")
        cleared = holders.clear(self.ssh.hosts, cluster,
                                port if cluster.coordinator_port is None else None, dry_run, labels,
                                live_runs=tuple(preflight.beside(checks)))
        holders.report(self.console, cleared, cluster.libtpu_lockfile, dry_run)
        coordinator_ip = self.ssh.coordinator_ip()
        # after the holders are cleared: the port is free; host 0 is the first slice's worker 0
        self.ssh.check_coordinator(host_port(coordinator_ip, port), key=("cluster", "tpu"))
        placements = self.ssh.placements(extra_env=self.slice_envs(len(found.hosts), coordinator_ip))
        return placements, host_port(coordinator_ip, port)

    def describe_start(self, plan: planning.Plan) -> str:
        cluster: TpuCluster = plan.job.cluster
        return (f"starting {plural(plan.num_processes, 'process')} ({plural(cluster.slice_count, 'slice')} x "
                f"{plural(cluster.hosts_per_slice, 'host')} of {cluster.accelerator_type}) x "
                f"{plural(plan.job.local_device_count, cluster.platform + ' device')} over ssh, "
                f"coordinator {plan.coordinator_address}")

    def start(self, plan: planning.Plan) -> list:
        return self.ssh.start(plan)

    def end_attempt(self) -> None:
        if self.ssh is not None:
            self.ssh.close()
