"""Real hosts over SSH (fabric): preflight every host, fan out, stream, tear down.

The package, by concern: ``settings`` (the ``cluster:`` dataclasses),
``hosts`` (settings by precedence, ssh_config, connect errors),
``connection`` (one host's connection, known_hosts policy, keepalive, short
scripts, signalling), ``preflight`` (checks and the refusal table),
``transfer`` (SFTP), ``mirror`` (process 0's checkpoints), ``workers``
(``SshWorker``), ``session`` (``SshSession`` and the ``SshHosts`` machinery the
tpu backend shares). The programs run on the hosts are ``launcher.remote``.

Importing this package imports no SSH library (a spec is loaded through
``cluster_type``): fabric and paramiko come with ``SshBackend.session``.
"""

from __future__ import annotations

from launcher.backends.base import Backend, Options, Session
from launcher.backends.ssh.settings import SshCluster


class SshBackend(Backend):
    name = "ssh"
    cluster_type = SshCluster
    stops_stale = True

    def check(self, job, options: Options) -> None:
        from launcher.spec import checks

        checks.check_syncs(job)

    def session(self, job, run_dir: str, console=None, options: Options | None = None) -> Session:
        from launcher.backends.ssh.session import SshSession  # imports fabric

        return SshSession(job, run_dir, console, options)
