"""``from podlaunch import program`` (or ``import podlaunch.program``): the helper a user's
program calls to join the job and report progress, under a name that is podlaunch's own.

This module is ``worker.program`` itself, not a copy (one module object, one state), so a
program that still writes ``from worker import program`` and one that imports this name
share the same ``initialize()``. The ``worker`` package is taken from beside this one even
when the program's directory holds a ``worker.py`` of its own (the script's directory comes
first on ``sys.path``): in a program that uses the helper, ``worker`` is podlaunch's.
"""

import importlib.machinery
import importlib.util
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ours(module) -> bool:
    paths = list(getattr(module, "__path__", None) or [])
    return bool(paths) and os.path.realpath(os.path.dirname(paths[0])) == os.path.realpath(_ROOT)


def _load_worker() -> None:
    """Put podlaunch's ``worker`` package (the one installed beside ``podlaunch``) in
    ``sys.modules``, ahead of any module of that name earlier on ``sys.path``."""
    if _ours(sys.modules.get("worker")):
        return
    found = importlib.machinery.PathFinder.find_spec("worker", [_ROOT])
    if found is None:
        raise ImportError(f"podlaunch's worker package is not beside {os.path.dirname(__file__)}:"
                          " reinstall podlaunch")
    module = importlib.util.module_from_spec(found)
    sys.modules["worker"] = module
    found.loader.exec_module(module)


_load_worker()
from worker import program as _program  # noqa: E402

sys.modules[__name__] = _program
