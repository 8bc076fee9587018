"""The ray backend: one process per bundle of a placement group on a Ray cluster.

See docs/ray.md. Modules: ``settings`` (the ``cluster:`` keys), ``placement`` (the bundles,
the refusal of a request the cluster can never meet, the reservation and its count-down),
``host`` (the actor on each bundle that starts its process under the wrapper), ``workers``
(that process as the launcher sees it) and ``session`` (the lifecycle). Importing this package
imports no Ray: it comes with ``RayBackend.session``.
"""

from __future__ import annotations

import importlib.util

from launcher.backends.base import Backend, Options, Session
from launcher.backends.ray.settings import RayCluster
from launcher.errors import Problem, SpecError
from launcher.spec import checks
from launcher.words import pip_install


class RayBackend(Backend):
    name = "ray"
    cluster_type = RayCluster
    docs = ("docs/ray.md",)

    def check(self, job, options: Options) -> None:
        if importlib.util.find_spec("ray") is None:
            raise SpecError([Problem(*job.where(("cluster", "backend")), "cluster.backend",
                                     "ray needs Ray installed beside the launcher: "
                                     f"{pip_install('ray')}")])
        # the nodes share this filesystem and this Python's packages (docs/ray.md)
        checks.check_task_importable(job)
        checks.check_worker_is_podlaunchs(job)

    def session(self, job, run_dir: str, console=None, options: Options | None = None) -> Session:
        from launcher.backends.ray.session import RaySession  # imports Ray when it connects
        return RaySession(job, run_dir, console, options)
