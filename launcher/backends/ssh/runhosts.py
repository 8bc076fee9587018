"""One run's hosts over SSH: the machinery the ssh and tpu backends share.

``SshHosts`` is built from an ``SshSettings`` and a list of host specs (the user's hosts, or
the addresses gcloud reported): per attempt it resolves, connects and preflights every host,
lays out their ``Placement``s, starts the workers, and closes its connections at the end of
the attempt. ``launcher.backends.ssh.session.SshSession`` and the tpu backend's session are
built on it.
"""

from __future__ import annotations

import time
from typing import Sequence

from launcher import plan as planning
from launcher import versions
from launcher.backends.ssh import hosts as hostlib
from launcher.backends.ssh import preflight as checks
from launcher.backends.ssh import reach
from launcher.backends.ssh.channels import HostChannels, close_all
from launcher.backends.ssh.connection import COMMAND_TIMEOUT_S
from launcher.backends.ssh.settings import SshHost, SshSettings
from launcher.backends.ssh.starting import start_all
from launcher.words import plural
from worker.contract.address import host_port


class SshHosts:
    """One run's hosts over SSH; each attempt connects anew (``connect`` ... ``close``).

    Args:
      job: the validated spec.
      settings: how to reach and run on the hosts.
      specs: the hosts, in placement order (host 0 runs the coordinator).
      counts: worker processes per host, same order.
      run_dir: the local run directory.
      console: where progress is reported.
      detached: a detached run's: its workers outlive the supervisor (``starting.start_host``).
    """

    def __init__(self, job, settings: SshSettings, specs: Sequence[SshHost],
                 counts: Sequence[int], run_dir: str, console, detached: bool = False):
        self.job, self.settings, self.run_dir, self.console = job, settings, run_dir, console
        self.specs, self.counts, self.detached = tuple(specs), tuple(counts), detached
        self.hosts: list = []
        self.channels: dict = {}  # host index -> HostChannels: the attempt's checks and workers
        self.preflight_s = 0.0    # the last connect's preflight, for ``report``
        self.listener = None      # host 0's coordinator listener, from connect to the check

    def resolve(self) -> list:
        """The hosts with their settings by precedence; nothing is contacted.

        Raises:
          SpecError: ``ssh_config_file`` names a missing file.
        """
        return hostlib.resolve(self.settings, self.specs, self.counts, self.job.source)

    def labels(self, hosts: Sequence) -> list:
        """Per host, its processes as the plan will number them ("p0", "p2,p3")."""
        return checks.labels(self.job, self.placements(hosts))

    def connect(self, survivors: str = checks.REFUSE, port: int | None = None,
                refuse: bool = True, reference: dict | None = None, say: bool = True,
                listen: bool = False) -> list:
        """Resolve, connect and preflight every host; connections stay open until ``close``.

        Args:
          survivors: what to do with survivors of an earlier run (``preflight.REFUSE``,
            ``STOP`` or ``REPORT``).
          port: the coordinator port to check on host 0 (0 picks one); None: no check.
          refuse: raise when a host is unfit; False: return the checks, some with a
            reason, every connection closed (``refuse_unfit`` raises what True would).
          reference: the versions every host must have (``preflight.judge``).
          say: report the preflight on the console now; False: the caller calls ``report``
            once (a restart that connects again after a quarantine says it once).
          listen: start host 0's coordinator listener once its preflight found the port,
            and let every other host's preflight try it (``check_coordinator`` then asks
            only host 0 itself).

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
                                 planning.remote_run_name(self.run_dir), refuse=refuse,
                                 reference=reference, listen=self._listen if listen else None)
        if self.listener is not None:
            self.listener.answers = {c.host.index: c.facts["reach"] for c in found if "reach" in c.facts}
        if any(c.reason for c in found):
            for host in hosts:
                host.close()
            return found
        self.hosts = hosts
        self.channels = {h.index: HostChannels(h) for h in hosts}
        self.preflight_s = time.monotonic() - started
        if say:
            self.report(found, survivors)
        return found

    def _listen(self, first: checks.Check) -> reach.Listener | None:
        """Host 0's listener on the port its preflight found (None: no port, or it failed)."""
        if first.reason is not None or first.facts.get("port") is None:
            return None
        address = host_port(hostlib.coordinator_ip(first.host), first.facts["port"])
        # outlasting the other hosts' preflights: max_parallel at a time, each bounded by the
        # connect timeout, paramiko's banner and auth timeouts (15 and 30 s) and the command's
        batches = -(-(len(self.specs) - 1) // self.settings.max_parallel)
        timeout_s = reach.LISTEN_TIMEOUT_S + batches * (
            COMMAND_TIMEOUT_S + 45 + (self.settings.connect_timeout_s or hostlib.DEFAULT_CONNECT_TIMEOUT_S))
        self.listener = reach.Listener(first.host, address, timeout_s)  # ended at the check
        transport = first.host.connection.transport
        return self.listener if self.listener.start(lambda t: transport.open_session(timeout=t)) else None

    def report(self, found: list, survivors: str) -> None:
        """Say what the last ``connect`` found: its time, versions, survivors stopped or left,
        launches beside this one."""
        stopped = checks.survivors_found(found)
        self.console.say(f"preflight ok on {plural(len(found), 'host')} in {self.preflight_s:.1f}s "
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

    def placements(self, hosts: Sequence | None = None, extra_env: Sequence[dict] | None = None
                   ) -> tuple:
        """The Placements of ``hosts`` (default: the connected ones, remote paths absolute)."""
        return hostlib.placements(self.job, self.settings, self.hosts if hosts is None else hosts,
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
        listener, self.listener = self.listener, None
        reach.check([self.channels[h.index] for h in self.hosts], address,
                    self.labels(self.hosts), self.job.where(key), path, self.console,
                    cpu_collectives, listener)

    def start(self, plan: planning.Plan) -> list:
        """Start every worker of ``plan`` (placements in this object's host order)."""
        return start_all(plan, self.channels, self.settings, self.console, self.detached)

    def close(self) -> None:
        """Close every connection of the current attempt (safe to call again)."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        close_all(self.channels)
        self.channels = {}
        for host in self.hosts:
            host.close()
        self.hosts = []
