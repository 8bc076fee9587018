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

import dataclasses
import os
import time
from typing import Sequence

from launcher import plan as planning
from launcher import versions
from launcher.backends.base import Session
from launcher.errors import LaunchError
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

    def connect(self, survivors: str = checks.REFUSE, port: int | None = None,
                refuse: bool = True) -> list:
        """Resolve, connect and preflight every host; connections stay open until ``close``.

        Args:
          survivors: what to do with survivors of an earlier run (``preflight.REFUSE``,
            ``STOP`` or ``REPORT``).
          port: the coordinator port to check on host 0 (0 picks one); None: no check.
          refuse: raise when a host is unfit; False: return the checks, some with a
            reason, every connection closed (``refuse_unfit`` raises what True would).

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
                                 os.path.basename(self.run_dir), refuse=refuse)
        if any(c.reason for c in found):
            for host in hosts:
                host.close()
            return found
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


SLOW_MARGIN_S = 0.010  # a slow host is this much slower per step too: no verdict on noise


def slow_hosts(result, ids: list, ratio: float) -> list:
    """``(host index, why)`` of the hosts whose processes' own time per step
    (``ProcessStats.mean_own_step_time_s``) was over ``ratio`` times the median process's and
    ``SLOW_MARGIN_S`` more (``restarts.quarantine_slower_than``).

    Args:
      result: the attempt's ``state.Result``.
      ids: per host, its process ids (``plan.process_ids``).
      ratio: the factor over the median.
    """
    own = {t.plan.process_id: t.stats.mean_own_step_time_s for t in result.processes}
    known = sorted(v for v in own.values() if v is not None)
    if len(known) < 2:
        return []
    median = known[len(known) // 2] if len(known) % 2 else sum(known[len(known) // 2 - 1:
                                                                     len(known) // 2 + 1]) / 2
    out = []
    for index, host_ids in enumerate(ids):
        worst = max((own[i] for i in host_ids if own.get(i) is not None), default=None)
        if worst is not None and worst > ratio * median and worst > median + SLOW_MARGIN_S:
            out.append((index, f"quarantined: its processes' own time per step was "
                        f"{worst * 1e3:.1f} ms, {worst / median if median else float('inf'):.1f} "
                        f"times the median process's {median * 1e3:.1f} ms "
                        f"(restarts.quarantine_slower_than {ratio:g})"))
    return out


class SshSession(Session):
    """The ssh backend: the user's hosts, in the order written, and its spares.

    A restart (``prepare(restart=True)``, or the first attempt of ``--resume``) runs on the
    hosts of the attempt before, except
    a host that fails its preflight after the fault or is quarantined (its processes
    failed ``restarts.quarantine_after`` times): the next of ``cluster.spares`` takes its
    place; with no spare left and ``restarts.min_processes`` set, the run shrinks onto
    the hosts left (``self.job`` is the spec with the hosts the next attempt runs on).
    Each change is in ``host_changes``.
    """

    def __init__(self, job, run_dir: str, console=None, options=None):
        super().__init__(job, run_dir, console, options)
        cluster = job.cluster
        self.spares = list(cluster.spares)
        self.failures: dict = {}      # SshHost -> faults of its processes in this run
        self.quarantine: dict = {}    # SshHost -> why, to be replaced at the next restart
        self.quarantined: list = []   # (SshHost, why) not used again in this run
        self.ssh = SshHosts(job, cluster, cluster.hosts,
                            [cluster.processes_on(h) for h in cluster.hosts], run_dir, self.console)

    def failed(self, plan: planning.Plan, failure, result=None) -> None:
        ids = planning.process_ids(plan.placements)
        if result is not None and self.job.restarts.quarantine_slower_than is not None:
            for index, why in slow_hosts(result, ids, self.job.restarts.quarantine_slower_than):
                self.quarantine.setdefault(self.ssh.specs[index], why)
        # an infrastructure fault or a stall counts against the host of the process it is
        # read from; a program error would repeat anywhere, a preemption is the system's
        if failure.failure_class.name not in ("INFRASTRUCTURE", "STALL") or failure.process_id < 0:
            return
        index = next(i for i, host_ids in enumerate(ids) if failure.process_id in host_ids)
        host = self.ssh.specs[index]
        self.failures[host] = self.failures.get(host, 0) + 1
        if self.failures[host] >= self.job.restarts.quarantine_after:
            self.quarantine[host] = (f"quarantined: its processes failed {self.failures[host]} "
                                     f"times in this run (restarts.quarantine_after "
                                     f"{self.job.restarts.quarantine_after}; last: {failure.why})")

    def prepare(self, restart: bool = False) -> tuple[tuple, str]:
        # a restart's survivors are the failed attempt's: ours to stop
        if self.options.dry_run:
            survivors = checks.REPORT if self.options.kill_stale else checks.REFUSE
        else:
            survivors = checks.STOP if self.options.kill_stale or restart else checks.REFUSE
        port = self.job.cluster.coordinator_port
        # a spare or a shrink only after a fault: a restart, or the first attempt of
        # --resume (a dry run and a new run refuse an unfit host: the spec is to be fixed)
        if not (restart or self.options.resume) or self.options.dry_run:
            found = self.ssh.connect(survivors, port=port)
        else:
            for host, why in list(self.quarantine.items()):
                del self.quarantine[host]
                if host in self.ssh.specs and self._replace(self.ssh.specs.index(host), why, True):
                    self.quarantined.append((host, why))
            while True:
                found = self.ssh.connect(survivors, port=port, refuse=False)
                unfit = [i for i, c in enumerate(found) if c.reason]
                if not unfit:
                    break
                labels = self.ssh.labels(self.ssh.resolve())
                # the last first, so the indices of the others stay where they are
                if not all(self._replace(i, f"preflight after the fault: {found[i].reason}")
                           for i in reversed(unfit)):
                    self._refuse(found, labels)
        address = contract.host_port(self.ssh.coordinator_ip(), found[0].facts['port'])
        self.ssh.check_coordinator(address)
        return self.ssh.placements(), address

    def _replace(self, index: int, why: str, optional: bool = False) -> bool:
        """Put the next spare in the place of host ``index``, or drop it when shrinking is
        allowed and the processes left stay at or over ``restarts.min_processes``.

        Args:
          optional: the host still works (quarantine): keep it when neither can be done.

        Returns:
          whether the host was replaced or dropped.
        """
        specs, counts = list(self.ssh.specs), list(self.ssh.counts)
        gone, ids = specs[index], planning.process_ids(self.ssh.placements(self.ssh.resolve()))[index]
        label = f"{gone.host} (" + ",".join(f"p{i}" for i in ids) + ")"
        floor = self.job.restarts.min_processes
        if self.spares:
            spare = self.spares.pop(0)
            specs[index], counts[index] = spare, self.job.cluster.processes_on(spare)
            text = f"{label} replaced by spare {spare.host}: {why}"
            change = {"host": gone.host, "process_ids": list(ids), "by": spare.host, "why": why}
        elif floor is not None and sum(counts) - counts[index] >= floor and len(specs) > 1:
            del specs[index], counts[index]
            text = (f"{label} dropped, no spare left: {why}; the run shrinks to "
                    f"{plural(sum(counts), 'process')} (restarts.min_processes {floor}), the "
                    "same global batch")
            change = {"host": gone.host, "process_ids": list(ids), "by": None, "why": why}
        else:
            if optional:
                self.console.say(f"{label} {why}; kept: no spare left in cluster.spares"
                                 + ("" if floor is None else
                                    f" and restarts.min_processes {floor} allows no fewer"))
            return False
        self.console.say(text)
        self.host_changes.append({**change, "text": text})
        self._use(specs, counts)
        return True

    def _use(self, specs: list, counts: list) -> None:
        """The next attempt runs on ``specs``: the spec and the SSH hosts say so."""
        cluster = dataclasses.replace(self.job.cluster, hosts=tuple(specs),
                                      spares=tuple(self.spares))
        self.job = dataclasses.replace(self.job, cluster=cluster)
        self.ssh.job, self.ssh.specs, self.ssh.counts = self.job, tuple(specs), tuple(counts)

    def _refuse(self, found: list, labels: list) -> None:
        """Raise preflight's refusal table, saying why no spare or shrink took the place."""
        floor = self.job.restarts.min_processes
        try:
            checks.refuse_unfit(found, [c.host for c in found], "preflight", labels)
        except LaunchError as exc:
            raise LaunchError(f"{exc}\nno spare left in cluster.spares, and "
                              + ("restarts.min_processes is unset (no shrinking)" if floor is None
                                 else f"restarts.min_processes {floor} allows no fewer "
                                 "processes")) from None

    def describe_start(self, plan: planning.Plan) -> str:
        job = plan.job
        devices = plural(job.local_device_count, f"{job.cluster.platform} device")
        return (f"starting {plural(plan.num_processes, 'process')} x {devices} on "
                f"{plural(len(plan.placements), 'host')} over ssh, coordinator {plan.coordinator_address}")

    def start(self, plan: planning.Plan) -> list:
        return self.ssh.start(plan)

    def end_attempt(self) -> None:
        self.ssh.close()
