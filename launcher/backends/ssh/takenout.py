"""The hosts an ssh run took out (quarantined, dropped, replaced), kept out and cleaned up.

A host taken out at a restart does not come back under another name: a spare that resolves
to its address (an ssh_config alias of it) is refused before it is contacted. Its local tier
(``checkpoint.local_dir``: a RAM disk, often) is left behind, and no worker of the run is
there to remove it at the run's end as the live hosts' writers remove theirs: when the run
has succeeded (``remove_copies``, every process ended), the launcher removes it over SSH,
one thread per host, joined when the session closes. Not before: hosts that share a
filesystem share the tier's directory, and a live host's copy in it is what a restart or a
``--resume`` of a failed run restores from.
"""

from __future__ import annotations

import os
import threading

from launcher import plan as planning
from launcher.backends.ssh import hosts as hostlib
from launcher.backends.ssh.connection import run_script
from launcher.backends.ssh.hostscript import shell_script

CLEANUP_TIMEOUT_S = 30.0


class TakenOut:
    """Addresses of the hosts the run took out, and their local copies' removal.

    Args:
      job: the validated spec (``name``, ``local_copies``).
      settings: the cluster's SSH settings (python, setup, env).
      run_dir: the local run directory (``plan.remote_run_name`` names the remote one).
      console: where a removal is said.
    """

    def __init__(self, job, settings, run_dir: str, console):
        self.job, self.settings, self.run_dir, self.console = job, settings, run_dir, console
        self.addresses: dict = {}   # address -> the name of the host taken out there
        self._seen: dict = {}       # SshHost -> its address, as last resolved
        self._threads: list = []
        self._out: list = []        # the SshHost entries taken out, in order

    def seen(self, specs, hosts) -> None:
        """Remember how ``specs`` resolved (``hosts``, same order)."""
        self._seen.update((spec, host.address) for spec, host in zip(specs, hosts))

    def reason(self, address: str) -> str | None:
        """Why a spare at ``address`` cannot take a place, or None."""
        if address not in self.addresses:
            return None
        return (f"it is {address}, host {self.addresses[address]}, which the run took out "
                "earlier (a host taken out does not come back under another name)")

    def took(self, specs) -> None:
        """The run no longer uses ``specs``: keep their addresses out from now on."""
        for spec in specs:
            if spec in self._seen:
                self.addresses.setdefault(self._seen[spec], spec.host)
            if spec not in self._out:
                self._out.append(spec)

    def remove_copies(self) -> None:
        """The run succeeded: remove the local copies on every host taken out (threads)."""
        if not self._out or not self.job.local_copies:
            return  # none kept (a program keeps its own checkpoints)
        for host in hostlib.resolve(self.settings, self._out, [1] * len(self._out), self.job.source):
            thread = threading.Thread(target=self._remove_copies, args=(host,), daemon=True,
                                      name=f"podlaunch-cleanup-{host.name}")
            thread.start()
            self._threads.append(thread)

    def _remove_copies(self, host) -> None:
        # relative to the workdir, which the script enters first (``~`` and a relative
        # workdir as the workers' own run directory is: the preflight's absolute path)
        run_dir = os.path.join("runs", self.job.name, planning.remote_run_name(self.run_dir))
        argv = [self.settings.python, "-P", "-m", "worker.recovery.localtier", "remove",
                self.job.checkpoint.local_dir, run_dir]
        output = ""
        try:
            host.open()
            status, output = run_script(host.connection.transport,
                                        shell_script(host.workdir, self.settings.setup,
                                                     dict(self.settings.env), argv),
                                        CLEANUP_TIMEOUT_S)
            why = None if status == 0 else (output.strip().splitlines() or ["no output"])[-1]
        except Exception as exc:  # noqa: BLE001  a host taken out may well be gone
            why = hostlib.connect_error(host, exc)
        finally:
            host.close()
        if why is not None:
            self.console.say(f"{host.name}: its local copies could not be removed ({why}); "
                             f"they are in {self.job.checkpoint.local_dir} of "
                             f"{os.path.join(host.workdir, run_dir)}")
        elif "podlaunch-localtier removed" in output:
            self.console.say(f"{host.name}: its local copies removed (taken out of the run)")

    def join(self, timeout_s: float = CLEANUP_TIMEOUT_S) -> None:
        """Wait for the removals started (each bounded by ``CLEANUP_TIMEOUT_S``)."""
        for thread in self._threads:
            thread.join(timeout_s)
        self._threads = []
