"""The ssh backend's session: the user's hosts, a restart's hosts and spares, over the
SSH machinery the tpu backend shares (``launcher.backends.ssh.runhosts.SshHosts``).
Nothing here assigns process ids: ``launcher.plan.make_plan`` does, in placement order
(host order).
"""

from __future__ import annotations

import dataclasses

from launcher import plan as planning
from launcher.backends.base import Session
from launcher.backends.ssh import preflight as checks
from launcher.backends.ssh import adoption, spares
from launcher.backends.ssh.runhosts import SshHosts
from launcher.backends.ssh.takenout import TakenOut
from launcher.words import plural
from worker.contract.address import host_port


class SshSession(Session):
    """The ssh backend: the user's hosts, in the order written, and its spares.

    A restart (``prepare(restart=True)``, or the first attempt of ``--resume``) runs on the
    hosts of the attempt before, except a host that fails its preflight after the fault,
    then one quarantined: a spare takes its place, or the run shrinks
    (``launcher.backends.ssh.spares``). ``self.job`` is the spec with the hosts the next
    attempt runs on; each change is in ``host_changes``, said once the restart's hosts
    are all fit.
    """
    def __init__(self, job, run_dir: str, console=None, options=None):
        super().__init__(job, run_dir, console, options)
        self.reattach = adoption.SshReattach(lambda: self.ssh, self.console)
        cluster = job.cluster
        self.spec_processes = job.num_processes
        self.spares = list(cluster.spares)
        self.failures: dict = {}      # SshHost -> faults of its processes in this run
        self.quarantine: dict = {}    # SshHost -> why, to be replaced at the next restart
        self.kept: set = set()        # quarantined hosts kept (no spare, no shrink): said once
        self.taken_out = TakenOut(job, cluster, run_dir, self.console)
        self.reference: dict | None = None  # python, jax, jaxlib of the run's first hosts
        self.ssh = SshHosts(job, cluster, cluster.hosts,
                            [cluster.processes_on(h) for h in cluster.hosts], run_dir, self.console,
                            self.options.detached)

    def failed(self, plan: planning.Plan, failure, result=None) -> None:
        ids = planning.process_ids(plan.placements)
        if result is not None and self.job.restarts.quarantine_slower_than is not None:
            for index, why in spares.slow_hosts(result, ids, self.job.restarts.quarantine_slower_than):
                self.quarantine.setdefault(self.ssh.specs[index], why)
        if not failure.failure_class.counts_against_host or failure.process_id < 0:
            return
        index = next(i for i, host_ids in enumerate(ids) if failure.process_id in host_ids)
        host = self.ssh.specs[index]
        self.failures[host] = self.failures.get(host, 0) + 1
        if self.failures[host] >= self.job.restarts.quarantine_after:
            self.quarantine[host] = (f"quarantined: its processes failed "
                                     f"{plural(self.failures[host], 'time')} in this run "
                                     f"(restarts.quarantine_after "
                                     f"{self.job.restarts.quarantine_after}; last: {failure.why})")

    def prepare(self, restart: bool = False) -> tuple[tuple, str]:
        if self.options.adopting and not restart:  # launch attach: its processes run there
            return adoption.reconnect(self.ssh, self.job.cluster.coordinator_port)[:2]
        # a restart's survivors are the failed attempt's: ours to stop
        if self.options.dry_run:
            survivors = checks.REPORT if self.options.kill_stale else checks.REFUSE
        elif self.options.kill_stale:
            survivors = checks.STOP
        else:  # a restart stops its own failed attempt's; another run's are refused, spares too
            survivors = checks.OWN if restart else checks.REFUSE
        port = self.job.cluster.coordinator_port
        # a spare or a shrink only after a fault: a restart, or the first attempt of
        # --resume (a dry run and a new run refuse an unfit host: the spec is to be fixed)
        first = not (restart or self.options.resume) or self.options.dry_run
        if first:
            found = self.ssh.connect(survivors, port=port, listen=True)
            if self.reference is None:
                self.reference = {k: found[0].facts.get(k) for k in checks.VERSION_KEYS}
        else:
            found = self._connect_replacing(survivors, port, restart)
        address = host_port(self.ssh.coordinator_ip(), found[0].facts['port'])
        self.ssh.check_coordinator(address)  # ends host 0's listener, up since its preflight
        if first and not restart and self.spares:
            self._check_spares()
        return self.ssh.placements(), address

    def _connect_replacing(self, survivors: str, port: int, restart: bool) -> list:
        """Connect the next attempt's hosts: a spare (or a shrink) in the place of each host
        unfit after the fault, then of each quarantined host; the changes are said and kept
        only once every host is fit (a restart refused leaves the run's hosts as they were).
        A spare that fails too gives the place to the next one: one change per host lost.

        Raises:
          LaunchError: a host is unfit and neither a spare nor a shrink can take its place.
        """
        before = spares.Layout(list(self.ssh.specs), list(self.ssh.counts), list(self.spares))
        layout, changes = before.copy(), []
        placed: dict = {}  # spare put in a place by this restart -> its change
        floor = self.job.restarts.min_processes
        lowest = self.spec_processes if floor is None else floor

        def replace(index: int, why: str, usable=lambda spare: True):
            prior = placed.pop(layout.specs[index], None)
            change = spares.replace(layout, index, why, floor, self.spec_processes,
                                    self.job.cluster.processes_on, usable, instead=prior)
            if change is not None:
                if prior is not None:
                    changes.remove(prior)
                if change["by"] is not None:
                    placed[layout.specs[index]] = change
                changes.append(change)
            return change

        while True:
            self._use(layout)
            hosts = self.ssh.resolve()
            self.taken_out.seen(self.ssh.specs, hosts)
            found = [checks.Check(h, why) for h, why in
                     zip(hosts, spares.address_taken(hosts, self.ssh.specs, set(before.specs),
                                                     self.taken_out.reason))]
            for h in hosts:
                h.close()
            if not any(c.reason for c in found):
                found = self.ssh.connect(survivors, port=port, refuse=False,
                                         reference=self.reference, say=False, listen=True)
            if self.reference is None:  # --resume: the spec's hosts, before any spare, set it
                fit = [c for c in found if c.reason is None and c.facts]
                if fit:
                    self.reference = {k: fit[0].facts.get(k) for k in checks.VERSION_KEYS}
            unfit = [i for i, c in enumerate(found) if c.reason]
            if unfit:
                labels = self.ssh.labels(self.ssh.resolve())
                for i in reversed(unfit):  # the last first: the others' indices stay
                    why = spares.why_no_spare(layout, i, lowest, self.job.cluster.processes_on)
                    prior = placed.get(layout.specs[i])
                    if prior is not None:  # the table's row is the spare: say whose place
                        why = (f"spare {prior['by']}, in the place of {prior['label']} "
                               f"({prior['why']}), failed its check too; {why}")
                    if replace(i, f"preflight after the fault: {found[i].reason}") is None:
                        self._use(before)
                        spares.refuse(found, labels, restart, why, floor)
                continue
            # every host fit: a quarantined one next, by a spare that passes its own check
            moved = False
            for i in reversed(range(len(layout.specs))):
                why = self.quarantine.pop(layout.specs[i], None)
                if why is None:
                    continue
                if replace(i, why, usable=self._spare_fit) is None:
                    if layout.specs[i] not in self.kept:
                        self.kept.add(layout.specs[i])
                        self.console.say(f"{layout.label(i)} {why}; kept: no spare or shrink can "
                                         "take its place")
                    continue
                moved = True
            if not moved:
                break
            self.ssh.close()
        self.ssh.report(found, survivors)
        for change in changes:
            self.console.say(change["text"])
            self.host_changes.append({k: v for k, v in change.items() if k != "label"})
        self.taken_out.took([spec for spec in before.specs if spec not in layout.specs])
        self.spares = layout.spares
        return found

    def _spare_fit(self, spare) -> bool:
        """Whether ``spare`` passes a preflight of its own (closed at once), said if not."""
        found = self._preflight_spares([spare])[0]
        if found.reason:
            self.console.say(f"spare {spare.host} not used: {found.reason}")
        return found.reason is None

    def _preflight_spares(self, specs: list) -> list:
        """Preflight ``specs`` as spares (no port check), closed after. A survivor of any run
        makes a spare unfit, as the restart's own preflight would find it (REFUSE, not REPORT:
        a spare passed here and then refused by the restart was taken for a host lost)."""
        others = SshHosts(self.job, self.job.cluster, specs,
                          [self.job.cluster.processes_on(s) for s in specs], self.run_dir,
                          self.console)
        hosts = others.resolve()
        found = checks.preflight(hosts, self.job, self.job.cluster, others.labels(hosts),
                                 checks.REFUSE, None, planning.remote_run_name(self.run_dir),
                                 refuse=False, reference=self.reference)
        taken = {h.address for h in self.ssh.hosts}
        for c in found:
            if c.reason is None and c.host.address in taken:
                c.reason = f"it is {c.host.address}, already one of cluster.hosts"
            elif c.reason is None and (out_why := self.taken_out.reason(c.host.address)):
                c.reason = out_why
            c.host.close()
        return found

    def _check_spares(self) -> None:
        """At the start (and in a dry run): say each spare that could not take a place now."""
        found = self._preflight_spares(list(self.spares))
        bad = [c for c in found if c.reason]
        for c in bad:
            self.console.say(f"warning: spare {c.host.name} is not fit now ({c.reason}); it is "
                             "checked again before it takes a place")
        if not bad:
            self.console.say(f"spares: {plural(len(found), 'host')} fit to take a place")

    def _use(self, layout: spares.Layout) -> None:
        """The next attempt runs on ``layout``'s hosts: the spec and the SSH hosts say so."""
        cluster = dataclasses.replace(self.job.cluster, hosts=tuple(layout.specs),
                                      spares=tuple(layout.spares))
        self.job = dataclasses.replace(self.job, cluster=cluster)
        self.ssh.job, self.ssh.specs, self.ssh.counts = self.job, tuple(layout.specs), tuple(layout.counts)

    def describe_start(self, plan: planning.Plan) -> str:
        job = plan.job
        devices = plural(job.local_device_count, f"{job.cluster.platform} device")
        return (f"starting {plural(plan.num_processes, 'process')} x {devices} on "
                f"{plural(len(plan.placements), 'host')} over ssh, coordinator {plan.coordinator_address}")

    def start(self, plan: planning.Plan) -> list:
        return self.ssh.start(plan)

    def end_attempt(self) -> None:
        self.ssh.close()

    def succeeded(self) -> None:
        self.taken_out.remove_copies()

    def close(self) -> None:
        super().close()
        self.taken_out.join()
