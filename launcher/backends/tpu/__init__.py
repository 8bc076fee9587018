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

# the names jobs/clusters/tpu-*.yaml and docs/tpu.md stand in with for the user's own: refused
# before gcloud is asked (its answer to them is an account or NOT_FOUND error in its own words)
PLACEHOLDERS = ("my-v4-32", "my-slice-0", "my-slice-1", "my-qr", "my-project", "my-user")
# the settings that name things: what each names, and what else the user may do
NAMED = {"tpu": ("the TPU's name", ""), "slices": ("a slice's name", ""),
         "queued_resource": ("the queued resource's name", ""),
         "project": ("the GCP project", ", or remove the line for gcloud's configured one"),
         "user": ("the login on the TPU VMs", ", or remove the line for your local user name")}


def placeholders(cluster: TpuCluster) -> list:
    """``[(key path, value)]`` of the cluster's settings left at an example's placeholder."""
    found = []
    named = {"tpu": cluster.tpu, "slices": cluster.slices, "queued_resource": cluster.queued_resource,
             "project": cluster.project, "user": cluster.user}
    for key, value in named.items():
        for i, item in enumerate(value) if isinstance(value, tuple) else [(None, value)]:
            if item in PLACEHOLDERS:
                found.append((("cluster", key) + (() if i is None else (i,)), item))
    return found


class TpuBackend(Backend):
    name = "tpu"
    cluster_type = TpuCluster
    docs = ("docs/tpu.md", "docs/ssh.md")  # its settings beside the ssh transport's
    stops_stale = True
    rehearses = "tpu"

    def check(self, job, options: Options) -> None:
        from launcher.errors import Problem, SpecError
        from launcher.spec import checks

        found = placeholders(job.cluster)
        if found:  # jobs/clusters/tpu-v4-32.yaml run as it is: gcloud is not asked
            raise SpecError([Problem(*job.where(key), ".".join(map(str, key[:2])) + (
                f"[{key[2]}]" if len(key) > 2 else ""), f"{value} is the example's placeholder for "
                f"{NAMED[key[1]][0]}: put yours there{NAMED[key[1]][1]} (docs/tpu.md; --rehearse "
                "runs the example here as it is); gcloud was not asked") for key, value in found])
        checks.check_syncs(job)

    def rehearsal(self, job) -> Backend:
        """The pod's exact topology as local CPU processes (``--rehearse``)."""
        from launcher.backends.tpu.rehearsal import RehearsalBackend

        return RehearsalBackend()

    def session(self, job, run_dir: str, console=None, options: Options | None = None) -> Session:
        from launcher.backends.tpu.session import TpuSession  # imports fabric

        return TpuSession(job, run_dir, console, options)
