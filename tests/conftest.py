"""The suite's floor plan: the harness modules beside the tests, and markers by what a test
starts, set from its fixtures (so no test can forget its marker):

* ``sshd``: real OpenSSH servers on loopback addresses (``sshenv``);
* ``slurm``: a real Slurm cluster on this machine (``slurmenv``);
* ``netns``: network namespaces (``netns``: a host that is really another machine);
* ``slow``: any of those, or real JAX worker processes (set by hand on the files and
  tests that launch workers).

``pytest -m "not slow"`` is the quick loop (seconds); ``-m "not sshd and not slurm"``
runs without system services; ``.ci/run`` runs everything.
"""

import inspect
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# What a fixture starts, read from its source once: the harness it calls
STARTS = {"sshd": ("hosts_or_skip", "SshTestEnv("), "slurm": ("SlurmTestEnv(",),
          "netns": ("netns.", "namespaces=")}
_starts: dict = {}


def _what(fixturedef) -> set:
    func = fixturedef.func
    if func not in _starts:
        try:
            source = inspect.getsource(func)
        except (OSError, TypeError):
            source = ""
        _starts[func] = {mark for mark, words in STARTS.items() if any(w in source for w in words)}
    return _starts[func]


def pytest_configure(config):
    for mark, words in (("sshd", "real OpenSSH servers on loopback addresses"),
                        ("slurm", "a real Slurm cluster (slurmctld, slurmd, munge)"),
                        ("netns", "network namespaces (unshare -n)")):
        config.addinivalue_line("markers", f"{mark}: starts {words} (set from its fixtures)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        marks = set()
        for name in info.names_closure:
            for fixturedef in info.name2fixturedefs.get(name, ()):
                marks |= _what(fixturedef)
        for mark in sorted(marks):
            item.add_marker(getattr(pytest.mark, mark))
        if marks:
            item.add_marker(pytest.mark.slow)
