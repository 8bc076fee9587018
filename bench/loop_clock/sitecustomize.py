"""Clock sums around the worker loop's parts, for bench/loop_clock.py (nothing else imports it).

Put on ``PYTHONPATH`` with ``LOOP_CLOCK_OUT`` set to a folder, it acts in a worker process
alone (``python -m worker``): each function named in ``PARTS`` is wrapped, when its module is
imported, in a ``time.perf_counter`` sum and a call count, and the sums are written to
``LOOP_CLOCK_OUT/<pid>.json`` (``{name: [seconds, calls]}``) when ``worker.trainer.loop.train``
returns or raises. Nested parts each count their own time (a read inside a log action counts
in both). Every other process started with it is left alone.
"""

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

PARTS = {
    "worker.trainer.calls": ["_inputs_dropped.__call__", "InFlight.add", "StepCalls._compile",
                             "StepCalls.__call__"],
    "worker.telemetry.metrics": ["StepLogger.keep", "fetch_when_done", "StepLogger.after_dispatch",
                                 "StepLogger.read", "StepLogger.wait", "StepLogger.finish"],
    "worker.telemetry.records": ["Records.add"],
    "worker.contract.wire": ["Progress.text"],
    "worker.trainer.loop": ["Loop.run", "Loop._quiet_calls"],
    "worker.trainer.actions": ["Log.after", "LocalCopy.after", "Save.after"],
    "worker.telemetry.tracker": ["BackgroundTracker.rows", "BackgroundTracker.flush"],
}


def _is_worker() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as file:
            argv = file.read().split(b"\0")
    except OSError:
        return False
    return any(a == b"-m" and b == b"worker" for a, b in zip(argv, argv[1:]))


def _install(out: str) -> None:
    sums: dict = {}
    clock = time.perf_counter

    def wrap(name, function):
        def timed(*args, **kwargs):
            begin = clock()
            try:
                return function(*args, **kwargs)
            finally:
                entry = sums.setdefault(name, [0.0, 0])
                entry[0] += clock() - begin
                entry[1] += 1
        return timed

    def dump():
        with open(os.path.join(out, f"{os.getpid()}.json"), "w", encoding="utf-8") as file:
            json.dump(sums, file)

    def patch(module):
        for dotted in PARTS[module.__name__]:
            *path, name = dotted.split(".")
            owner = module
            for part in path:
                owner = getattr(owner, part)
            setattr(owner, name, wrap(dotted, getattr(owner, name)))
        if module.__name__ == "worker.trainer.loop":
            train = module.train

            def train_then_dump(*args, **kwargs):
                try:
                    return train(*args, **kwargs)
                finally:
                    dump()
            module.train = train_then_dump

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in PARTS:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                execute = spec.loader.exec_module

                def exec_module(module):
                    execute(module)
                    patch(module)
                spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder())


if os.environ.get("LOOP_CLOCK_OUT") and _is_worker():
    _install(os.environ["LOOP_CLOCK_OUT"])
