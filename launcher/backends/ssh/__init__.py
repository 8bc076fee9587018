"""Real hosts over SSH (fabric): preflight every host, fan out, stream, tear down.

The package, by concern: ``settings`` (the ``cluster:`` dataclasses),
``hosts`` (settings by precedence, ssh_config, connect errors),
``connection`` (one host's connection, known_hosts policy, keepalive, short
scripts, signalling), ``preflight`` (checks and the refusal table),
``syncdir`` (a directory synced), ``transfer`` (SFTP, results), ``mirror`` (process 0's checkpoints), ``workers``
(``SshWorker``), ``starting`` (the fan-out), ``runhosts`` (``SshHosts``, one run's hosts: the machinery the tpu
backend shares), ``session`` (``SshSession``). The programs run on the hosts are ``launcher.remote``.

Importing this package imports no SSH library (a spec is loaded through
``cluster_type``): fabric and paramiko come with ``SshBackend.session``.
"""

from __future__ import annotations

from launcher.backends.base import Backend, Options, Session
from launcher.backends.ssh.settings import SshCluster


# host names no one can own (RFC 2606): an example cluster's, refused before any connection
PLACEHOLDER_DOMAINS = (".invalid", ".example")


class SshBackend(Backend):
    name = "ssh"
    cluster_type = SshCluster
    docs = ("docs/ssh.md",)
    stops_stale = True

    def check(self, job, options: Options) -> None:
        from launcher.spec import checks

        checks.check_syncs(job)
        placeholders = [(i, h.host) for i, h in enumerate(job.cluster.hosts)
                        if h.host.lower().rstrip(".").endswith(PLACEHOLDER_DOMAINS)]
        if placeholders:  # jobs/clusters/ssh-example.yaml run as it is: nothing is reached
            from launcher.errors import Problem, SpecError

            where = job.where(("cluster", "hosts", 0))  # the cluster file (its first host's line)
            raise SpecError([Problem(where[0], where[1] if i == 0 else None, f"cluster.hosts[{i}]",
                                     f"{host} is a placeholder (RFC 2606 reserves .invalid and "
                                     ".example): put your own hosts in the cluster file "
                                     "(docs/ssh.md); nothing was contacted")
                             for i, host in placeholders])

    def session(self, job, run_dir: str, console=None, options: Options | None = None) -> Session:
        from launcher.backends.ssh.session import SshSession  # imports fabric

        return SshSession(job, run_dir, console, options)
