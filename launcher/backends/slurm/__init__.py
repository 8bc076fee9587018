"""The slurm backend: the same job on a Slurm cluster, in an allocation or a job it submits.

See docs/slurm.md. Modules: ``settings`` (the ``cluster:`` keys), ``commands``
(Slurm's client commands, scrubbed environment), ``script`` (the batch
script), ``nodes`` (every node's versions and the coordinator port, checked
before the processes join), ``workers`` (one srun step per process),
``filed`` (a detached run's step, its output in files of the run),
``adoption`` (a detached run taken back by ``launch attach``),
``session`` (the lifecycle).
"""

from __future__ import annotations

from launcher.spec import checks
from launcher.backends.base import Backend, Options, Session
from launcher.backends.slurm.settings import SlurmCluster


# the client commands a launch runs (launcher.backends.slurm.commands)
CLIENT_COMMANDS = ("sinfo", "sbatch", "srun", "squeue", "scontrol", "scancel")


class SlurmBackend(Backend):
    name = "slurm"
    cluster_type = SlurmCluster
    docs = ("docs/slurm.md",)
    stops_stale = True

    def check(self, job, options: Options) -> None:
        import shutil

        from launcher.errors import Problem, SpecError

        missing = [name for name in CLIENT_COMMANDS if shutil.which(name) is None]
        if missing:  # as platform: gpu where no GPU is: this machine cannot run the cluster
            raise SpecError([Problem(*job.where(("cluster", "backend")), "cluster.backend",
                                     f"slurm, but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                                     "not on PATH here: run launch on a login node of your Slurm "
                                     "cluster or inside salloc there, or put Slurm's client "
                                     "commands on PATH (docs/slurm.md); nothing was asked of Slurm")])
        # the nodes share this filesystem (workers run `python -m worker` from it)
        checks.check_task_importable(job)
        checks.check_worker_is_podlaunchs(job)

    def session(self, job, run_dir: str, console=None, options: Options | None = None) -> Session:
        from launcher.backends.slurm.session import SlurmSession
        return SlurmSession(job, run_dir, console, options)
