"""Cloud TPU VM slices: discover the hosts with gcloud, clear stale TPU holders, run over SSH.

``discovery`` asks gcloud for the slices and their hosts, ``holders`` finds
(and when asked stops) processes holding a host's TPU, ``session`` composes
both with the ssh backend's machinery. Importing this package imports no SSH
library (a spec is loaded through ``cluster_type``; ``--rehearse`` runs
locally): fabric and paramiko come with ``TpuBackend.session``.
"""

from __future__ import annotations

from launcher.backends.base import Backend, Options, Session
from launcher.backends.tpu.settings import TpuCluster


class TpuBackend(Backend):
    name = "tpu"
    cluster_type = TpuCluster
    docs = ("docs/tpu.md", "docs/ssh.md")  # its settings beside the ssh transport's
    stops_stale = True
    rehearses = "tpu"

    def check(self, job, options: Options) -> None:
        from launcher.spec import checks

        checks.check_syncs(job)

    def rehearsal(self, job) -> Backend:
        """The pod's exact topology as local CPU processes (``--rehearse``)."""
        from launcher.backends.tpu.rehearsal import RehearsalBackend

        return RehearsalBackend()

    def session(self, job, run_dir: str, console=None, options: Options | None = None) -> Session:
        from launcher.backends.tpu.session import TpuSession  # imports fabric

        return TpuSession(job, run_dir, console, options)
