"""The ssh backend's session, and the SSH machinery the tpu backend shares.

``SshHosts`` is one run's hosts over SSH, built from an ``SshSettings`` and a
list of host specs (the user's hosts, or the addresses gcloud reported):
per attempt it resolves, connects and preflights every host, lays out their
``Placement``s, starts the workers, and closes its connections at the end of
the attempt. ``SshSession`` is the ssh backend's ``Session`` on top of it.
Nothing here assigns process ids: ``launcher.plan.make_plan`` does, in
placement order (host order).
"""

from __future__ import annotations

import os
import time
from typing import Sequence

from launcher import plan as planning
from launcher import versions
from launcher.backends.base import Session
from launcher.backends.ssh import hosts as hostlib
from launcher.backends.ssh import preflight as checks
from launcher.backends.ssh import reach
from launcher.backends.ssh.channels import HostChannels, close_all
from launcher.backends.ssh.settings import SshHost, SshSettings
from launcher.backends.ssh.workers import start_all
from launcher.console.words import plural
from worker import contract


def placements(job, settings: SshSettings, hosts: Sequence, run_dir: str,
               extra_env: Sequence[dict] | None = None) -> tuple:
    """One Placement per host, in host order.

    Args:
      job: the validated spec (name, devices per process, platform).
      settings: the cluster's SSH settings (python, env).
      hosts: resolved hosts (``name``, ``workdir``, ``num_processes``).
      run_dir: the local run directory (its name is the remote one's).
      extra_env: per host, environment beyond ``settings.env`` (a TPU slice's).

    The remote run directory is ``<workdir>/runs/<job>/<run>``, and the job JSON
    is in it (each run its own: launches of one job side by side keep theirs).
    """
    out = []
    for i, host in enumerate(hosts):
        remote_run_dir = os.path.join(host.workdir, "runs", job.name, os.path.basename(run_dir))
        out.append(planning.Placement(
            host=host.name, num_processes=host.num_processes,
            local_device_count=job.local_device_count, platform=job.cluster.platform,
            python=settings.python,
            run_dir=remote_run_dir, job_path=os.path.join(remote_run_dir, "job.json"),
            env={**settings.env, **(extra_env[i] if extra_env else {})}, label_host=True))
    return tuple(out)


class SshHosts:
    """One run's hosts over SSH; each attempt connects anew (``connect`` ... ``close``).

    Args:
      job: the validated spec.
      settings: how to reach and run on the hosts.
      specs: the hosts, in placement order (host 0 runs the coordinator).
      counts: worker processes per host, same order.
      run_dir: the local run directory.
      console: where progress is reported.
    """

    def __init__(self, job, settings: SshSettings, specs: Sequence[SshHost],
                 counts: Sequence[int], run_dir: str, console):
        self.job, self.settings, self.run_dir, self.console = job, settings, run_dir, console
        self.specs, self.counts = tuple(specs), tuple(counts)
        self.hosts: list = []
        self.channels: dict = {}  # host index -> HostChannels: the attempt's checks and workers

    def resolve(self) -> list:
        """The hosts with their settings by precedence; nothing is contacted.

        Raises:
          SpecError: ``ssh_config_file`` names a missing file.
        """
        return hostlib.resolve(self.settings, self.specs, self.counts, self.job.source)

    def labels(self, hosts: Sequence) -> list:
        """Per host, its processes as the plan will number them ("p0", "p2,p3")."""
        return checks.labels(self.job, self.placements(hosts))

    def connect(self, survivors: str = checks.REFUSE, port: int | None = None) -> list:
        """Resolve, connect and preflight every host; connections stay open until ``close``.

        Args:
          survivors: what to do with survivors of an earlier run (``preflight.REFUSE``,
            ``STOP`` or ``REPORT``).
          port: the coordinator port to check on host 0 (0 picks one); None: no check.

        Returns:
          One ``preflight.Check`` per host, in host order.

        Raises:
          SpecError: bad settings (a missing ssh_config_file).
          LaunchError: some host is unfit (a table of hosts and reasons).
        """
        self.close()
        hosts = self.resolve()
        started = time.monotonic()
        found = checks.preflight(hosts, self.job, self.settings, self.labels(hosts), survivors, port,
                                 os.path.basename(self.run_dir))
        self.hosts = hosts
        self.channels = {h.index: HostChannels(h) for h in hosts}
        stopped = checks.survivors_found(found)
        self.console.say(f"preflight ok on {plural(len(hosts), 'host')} in {time.monotonic() - started:.1f}s "
                         f"(python {found[0].facts['python']}, jax {found[0].facts['jax']})"
                         + (f"; stopped {plural(len(stopped), 'stale process group')}" if stopped else ""))
        # preflight refused hosts whose versions differ, so host 0 speaks for all
        untested = versions.outside_tested(found[0].facts["jax"], found[0].facts["python"])
        if untested:
            self.console.say(f"warning: on every host, {untested}")
        for other in checks.beside(found):
            self.console.say(f"another launch of {self.job.name!r} runs on these hosts ({other}), "
                             "its launcher still connected: this one runs beside it")
        left = checks.survivors_found(found, stopped=False)
        if left and survivors == checks.REPORT:
            ids = ", ".join(f"p{r['process_id']} (pgid {r['pgid']})" for r in left)
            self.console.say(f"dry run: {plural(len(left), 'process group')} of an earlier run still alive, "
                             f"left running: {ids}")
        return found

    def placements(self, hosts: Sequence | None = None, extra_env: Sequence[dict] | None = None
                   ) -> tuple:
        """The Placements of ``hosts`` (default: the connected ones, remote paths absolute)."""
        return placements(self.job, self.settings, self.hosts if hosts is None else hosts,
                          self.run_dir, extra_env)

    def coordinator_ip(self) -> str:
        """Host 0's address, resolved once here so every worker gets the same one."""
        return hostlib.coordinator_ip(self.hosts[0])

    def check_coordinator(self, address: str, key: tuple = ("cluster", "hosts", 0)) -> None:
        """Refuse ``address`` unless every host reaches it (``reach.check``; after ``connect``).

        Args:
          address: the coordinator_address the workers will get (``ip:port``).
          key: the setting that named host 0, for the message.

        Raises:
          SpecError: some host cannot reach it (nothing was started).
        """
        path = ".".join(str(k) for k in key[:2]) + "".join(f"[{k}]" for k in key[2:])
        cpu_collectives = self.job.cluster.platform == "cpu" and self.job.num_processes > 1
        reach.check([self.channels[h.index] for h in self.hosts], address,
                    self.labels(self.hosts), self.job.where(key), path, self.console,
                    cpu_collectives)

    def start(self, plan: planning.Plan) -> list:
        """Start every worker of ``plan`` (placements in this object's host order)."""
        return start_all(plan, self.channels, self.settings, self.console)

    def close(self) -> None:
        """Close every connection of the current attempt (safe to call again)."""
        close_all(self.channels)
        self.channels = {}
        for host in self.hosts:
            host.close()
        self.hosts = []


class SshSession(Session):
    """The ssh backend: the user's hosts, in the order written."""

    def __init__(self, job, run_dir: str, console=None, options=None):
        super().__init__(job, run_dir, console, options)
        cluster = job.cluster
        self.ssh = SshHosts(job, cluster, cluster.hosts,
                            [cluster.processes_on(h) for h in cluster.hosts], run_dir, self.console)

    def prepare(self, restart: bool = False) -> tuple[tuple, str]:
        # a restart's survivors are the failed attempt's: ours to stop
        if self.options.dry_run:
            survivors = checks.REPORT if self.options.kill_stale else checks.REFUSE
        else:
            survivors = checks.STOP if self.options.kill_stale or restart else checks.REFUSE
        found = self.ssh.connect(survivors, port=self.job.cluster.coordinator_port)
        address = contract.host_port(self.ssh.coordinator_ip(), found[0].facts['port'])
        self.ssh.check_coordinator(address)
        return self.ssh.placements(), address

    def describe_start(self, plan: planning.Plan) -> str:
        job = plan.job
        devices = plural(job.local_device_count, f"{job.cluster.platform} device")
        return (f"starting {plural(plan.num_processes, 'process')} x {devices} on "
                f"{plural(len(plan.placements), 'host')} over ssh, coordinator {plan.coordinator_address}")

    def start(self, plan: planning.Plan) -> list:
        return self.ssh.start(plan)

    def end_attempt(self) -> None:
        self.ssh.close()
