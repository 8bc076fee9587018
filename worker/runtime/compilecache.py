"""JAX's persistent compilation cache as the worker uses it: the directory the launcher
names (or JAX_COMPILATION_CACHE_DIR), its hits and misses counted from JAX's own events."""

from __future__ import annotations

import os

from worker import contract
from worker.contract import wire

# JAX reads it at import into ``jax_compilation_cache_dir``, which the worker sets again below:
# without this, a directory the user named for every JAX program would be ignored here.
JAX_CACHE_DIR_VAR = "JAX_COMPILATION_CACHE_DIR"


class CompilationCache:
    """JAX's persistent compilation cache in the directory the launcher names (or
    ``JAX_COMPILATION_CACHE_DIR``), counted.

    The launcher names it (``contract.COMPILATION_CACHE_DIR``;
    ``launcher.plan.compilation_cache_dir``): ``runs/<job>/compilation-cache``
    for a run in the default layout, shared by every run of the job, else
    ``<run dir>/compilation-cache`` (also the default when it names none).
    ``JAX_COMPILATION_CACHE_DIR`` (JAX's own variable for this directory) in a
    worker's environment names it instead, as it would for any JAX program: a
    cache a team keeps on a shared filesystem, or one per machine, used by
    every job there.
    Every attempt of a run uses the same directory, so a restart (or a re-run)
    loads what was compiled before instead of compiling again; so do the other
    local processes. JAX writes entries from process 0 only: processes on
    other hosts (whose directory is their own) read none and compile as
    before. Entries may also be rejected on reload (some CPUs), so hits and
    misses are counted from JAX's own monitoring events rather than assumed,
    and ``line()`` reports them.

    Args:
      path: the directory (made by JAX when missing), or None for ``run_dir``'s.
      run_dir: the run directory.
      enabled: False (``train.compilation_cache: false``): no cache, every compile a miss.
    """

    def __init__(self, path: str | None, run_dir: str, enabled: bool = True):
        import jax
        import jax.monitoring

        self.requests = self.hits = 0
        named = os.environ.get(JAX_CACHE_DIR_VAR)
        if named:  # ~ and a relative path: as this worker sees them
            path = os.path.abspath(os.path.expanduser(named))
        self.path = (path or os.path.join(run_dir, contract.COMPILATION_CACHE)) if enabled else "off"
        if enabled:  # off (train.compilation_cache: false): every compile is a miss
            jax.config.update("jax_compilation_cache_dir", self.path)
            # The worker's steps compile in well under JAX's default 1 s threshold on
            # small models; a restart should skip those compilations too.
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        else:  # no directory, as without the variable, which JAX itself would use
            jax.config.update("jax_compilation_cache_dir", None)

        def count(event: str, **kwargs) -> None:
            if event == "/jax/compilation_cache/compile_requests_use_cache":
                self.requests += 1
            elif event == "/jax/compilation_cache/cache_hits":
                self.hits += 1

        jax.monitoring.register_event_listener(count)

    def line(self, compile_time_s: float | None) -> str:
        """``wire.CacheReport``: hits, misses, the first call's seconds, the directory."""
        return wire.CacheReport(self.hits, self.requests - self.hits, compile_time_s,
                                self.path).text()
