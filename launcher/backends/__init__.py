"""The backend registry, keyed by ``cluster.backend``.

Each entry names a ``launcher.backends.base.Backend`` subclass as
``module:Class``; its module is imported only when a spec names it, so
``launch --help`` and a local run never import fabric. Nothing outside this
registry compares ``cluster.backend`` to a name.
"""

from __future__ import annotations

import importlib

REGISTRY = {
    "local": "launcher.backends.local:LocalBackend",
    "ssh": "launcher.backends.ssh:SshBackend",
    "tpu": "launcher.backends.tpu:TpuBackend",
    "slurm": "launcher.backends.slurm:SlurmBackend",
    "ray": "launcher.backends.ray:RayBackend",
}


def names() -> tuple:
    """The ``cluster.backend`` values a spec may use."""
    return tuple(REGISTRY)


def get(name: str):
    """A ``Backend`` instance for ``name``, or None when no backend has that name."""
    entry = REGISTRY.get(name)
    if entry is None:
        return None
    module, _, cls = entry.partition(":")
    return getattr(importlib.import_module(module), cls)()


def stopping_stale() -> tuple:
    """The names of the backends ``--kill-stale`` applies to (``Backend.stops_stale``)."""
    return tuple(name for name in REGISTRY if get(name).stops_stale)


def rehearsing() -> tuple:
    """What ``--rehearse`` applies to, one text per backend that has a rehearsal
    (``Backend.rehearses``: ``"tpu"``)."""
    return tuple(text for text in (get(name).rehearses for name in REGISTRY) if text)


def cluster_type(name: str):
    """The ``cluster:`` settings dataclass of backend ``name``, or None."""
    backend = get(name)
    return None if backend is None else backend.cluster_type


def for_job(job):
    """The ``Backend`` of a validated spec."""
    return get(job.cluster.backend)
