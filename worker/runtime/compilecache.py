"""JAX's persistent compilation cache as the worker uses it: the directory the launcher
names (or JAX_COMPILATION_CACHE_DIR), its hits and misses counted from JAX's own events."""

from __future__ import annotations

import os

from worker import contract
from worker.contract import wire

# JAX reads it at import into ``jax_compilation_cache_dir``, which the worker sets again below:
# without this, a directory the user named for every JAX program would be ignored here.
JAX_CACHE_DIR_VAR = "JAX_COMPILATION_CACHE_DIR"


# /proc/cpuinfo's fields that decide what code XLA compiles for this CPU: its features (flags)
# and its model, from which LLVM derives tuning features such as +prefer-no-scatter
CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "flags", "Features", "CPU part")


def machine(cpuinfo: str = "/proc/cpuinfo") -> str:
    """This machine's folder in a compilation cache: ``<arch>-<hash of CPU_FIELDS>``.

    JAX's cache key holds the program, the devices and the versions, not the host CPU that
    XLA:CPU compiles for; hosts of different CPUs sharing one cache (a shared file system)
    loaded each other's code, and XLA said so on the console of every process that did
    ("cpu_aot_loader ... Target machine feature +prefer-no-scatter is not supported on the
    host machine"). Hosts of one CPU share their folder."""
    import hashlib
    import platform

    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            first = f.read(1 << 16).split("\n\n")[0]
    except OSError:
        first = ""
    fields = sorted(line.split(":", 1)[0].strip() + ":" + line.split(":", 1)[1].strip()
                    for line in first.splitlines()
                    if ":" in line and line.split(":", 1)[0].strip() in CPU_FIELDS)
    digest = hashlib.sha256("\n".join(fields).encode()).hexdigest()[:12]
    return f"{platform.machine() or 'cpu'}-{digest}"


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
    Entries go to this machine's folder in it (``machine``): hosts of different CPUs never
    load each other's code. Every attempt of a run uses the same directory, so a restart (or a re-run)
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
            jax.config.update("jax_compilation_cache_dir", os.path.join(self.path, machine()))
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
