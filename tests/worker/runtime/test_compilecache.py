"""worker.runtime.compilecache: each machine's folder in a compilation cache that hosts share
(issue 71: a cache on a shared file system gave one CPU's compiled code to another, and XLA's
complaint about it reached the console of every process that loaded it)."""

from __future__ import annotations

import os

from worker.runtime import compilecache

SKYLAKE = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n"
           "model name\t: Intel(R) Xeon(R) Gold 6148\nflags\t\t: fpu sse avx2 avx512f\n"
           "bogomips\t: 4800.00\ncpu MHz\t\t: 2400.000\n\n"
           "processor\t: 1\nvendor_id\t: GenuineIntel\ncpu MHz\t\t: 2399.000\n")


def test_hosts_of_one_cpu_share_a_folder_and_hosts_of_another_have_their_own(tmp_path):
    def folder(text: str) -> str:
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        return compilecache.machine(str(path))

    here = folder(SKYLAKE)
    assert here == folder(SKYLAKE.replace("2400.000", "1200.000").replace("4800.00", "2400.00"))
    assert here != folder(SKYLAKE.replace("model\t\t: 85", "model\t\t: 106"))  # another model
    assert here != folder(SKYLAKE.replace(" avx512f", ""))                     # other features
    assert here.startswith(os.uname().machine + "-")
    assert compilecache.machine(str(tmp_path / "none")).startswith(os.uname().machine + "-")


def test_jax_writes_the_cache_in_this_machines_folder_of_the_named_directory(tmp_path):
    import jax

    before = jax.config.jax_compilation_cache_dir
    try:
        cache = compilecache.CompilationCache(str(tmp_path / "cache"), str(tmp_path))
        assert cache.path == str(tmp_path / "cache")  # what the report names
        assert jax.config.jax_compilation_cache_dir == str(
            tmp_path / "cache" / compilecache.machine())
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
