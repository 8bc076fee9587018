"""Checks of this machine that a job needs before anything starts here.

Backends that run workers on this machine (single-host debug mode, the TPU
rehearsal) call them from ``Backend.check``; the spec itself is checked on
load (``launcher.spec``). Each raises ``SpecError`` naming the spec key.
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import sys

from launcher.errors import Problem, SpecError
from launcher.spec import syncrules, taskargs
from launcher.words import plural
import worker as worker_package  # where podlaunch's own worker is
from worker.contract.sections import BUILTIN_TASKS  # the tasks worker.tasks builds in


def check_fits_in_memory(spec, memory_bytes: int | None = None) -> None:
    """For local runs: synthetic data, or a built-in task's model, that cannot fit in this
    machine's memory is refused.

    Synthetic data is generated, not read from a file: each process keeps the
    chunks it has generated (``worker.data.sources.Synthetic``), and with shuffled or
    several batches that is every row, so the processes on this machine together
    may hold ``num_processes x rows x (in_features + out_features) x 4`` bytes.
    File data is memory-mapped and never counted (docs/data.md).

    Raises:
      SpecError: that exceeds 80% of the machine's memory (``memory_bytes``,
        default the physical memory from ``sysconf``).
    """
    data = spec.rows_in_memory  # synthetic rows; a file is memory-mapped, a program's its own
    if data is None:
        return
    if memory_bytes is None:
        memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gib = 1 << 30

    def refuse_over(need: int, key: str, what: str, why: str, what_to_do: str) -> None:
        if need > 0.8 * memory_bytes:
            raise SpecError([Problem(*spec.where(("data", key)), f"data.{key}",
                                     f"{what} about {need / gib:.1f} GiB here ({why}), more than "
                                     f"80% of this machine's {memory_bytes / gib:.1f} GiB; "
                                     f"{what_to_do}")])

    if spec.task.name in BUILTIN_TASKS:  # a linear model: (in + 1) x out weights
        # every device of every process holds params, grads and up to two optimizer slots
        devices = spec.num_processes * spec.local_device_count
        refuse_over(devices * (data.in_features + 1) * data.out_features * 4 * 4, "in_features",
                    f"a {spec.task.name} model of {data.in_features} x {data.out_features} "
                    "float32 weights needs", f"params, gradients and optimizer state on each of "
                    f"{devices} devices", "lower data.in_features or data.out_features")
    rows, columns = data.num_examples, data.in_features + data.out_features
    refuse_over(spec.num_processes * rows * columns * 4, "num_examples",
                f"{rows} rows x {columns} float32 columns need",
                f"each of the {plural(spec.num_processes, 'process')} may generate every row",
                "lower data.num_examples or data.in_features, or write the data to a .npy file "
                "(memory-mapped, streamed)")


def worker_search_path(pythonpath: str | None) -> list:
    """The module search path of a local worker (``python -P -m worker`` in this directory).

    The worker's ``PYTHONPATH`` (``pythonpath``: cluster.env's, else this environment's);
    then this interpreter's own path (site-packages), without the launcher script's
    directory; then the current directory, which ``worker/__main__.py`` appends last so a
    user's ``worker.py`` there cannot hide podlaunch's package.
    """
    paths = []
    if pythonpath:
        paths += [os.path.abspath(p) for p in pythonpath.split(os.pathsep) if p]
    return paths + [p for p in sys.path[1:] if p] + [os.getcwd()]


def find_module(module: str, paths: list) -> bool:
    """Whether ``module`` (dotted) is findable on ``paths``; nothing is imported or executed."""
    return module_spec(module, paths) is not None


def module_spec(module: str, paths: list):
    """``module``'s (dotted) ``ModuleSpec`` as found on ``paths``, or None; nothing is imported
    or executed."""
    locations, found = paths, None
    for part in module.split("."):
        try:
            found = importlib.machinery.PathFinder.find_spec(part, locations)
        except (ImportError, ValueError):
            return None
        if found is None:
            return None
        locations = list(found.submodule_search_locations or [])
    return found


def check_task_importable(spec, pythonpath: str | None = None) -> None:
    """For local runs: a user task's module must be findable where the workers will look.

    Args:
      spec: the job.
      pythonpath: the workers' PYTHONPATH (default: cluster.env's, else this environment's).

    Raises:
      SpecError: the module is not on the workers' search path (``worker_search_path``), or
        ``task.args`` does not fit its function (``launcher.spec.taskargs``).
    """
    module = spec.task_module  # None: a built-in task, or a program's own imports
    if module is None:
        return
    if pythonpath is None:
        pythonpath = spec.cluster.env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
    found = module_spec(module, worker_search_path(pythonpath))
    if found is None:
        raise SpecError([Problem(*spec.where(("task", "name")), "task.name",
                                 f"module {module!r} is not importable by the workers (searched "
                                 "this directory, the workers' PYTHONPATH and site-packages); "
                                 "install it, run from its directory, or add its directory to "
                                 "cluster.env.PYTHONPATH")])
    if found.origin and found.origin.endswith(".py"):
        problems = taskargs.problems(spec, found.origin)
        if problems:
            raise SpecError(problems)


def check_program_found(spec) -> None:
    """For workers on this machine: a program job's command (``program.argv[0]``) must be one
    they can run: ``python``/``python3`` (the cluster's python), an executable file (a path,
    relative to the program's directory), or a name on the workers' PATH (``program.env.PATH``,
    else ``cluster.env.PATH``, else this environment's). Its wrapper's ``FileNotFoundError`` after the start said it late.

    Raises:
      SpecError: naming the key, where it was set, what was looked at, and a close name.
    """
    program = getattr(spec, "program", None)
    if program is None or program.argv[0] in ("python", "python3"):
        return
    command, hint = program.argv[0], ""
    if os.sep in command:
        path = command if os.path.isabs(command) else os.path.join(spec.working_directory, command)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return
        why = f"{os.path.normpath(path)} is not an executable file"
    else:
        # the workers' environment: program.env after cluster.env after this one (kinds.py)
        search = (program.env.get("PATH") or spec.cluster.env.get("PATH")
                  or os.environ.get("PATH", ""))
        if shutil.which(command, path=search):
            return
        import difflib  # only for a command that is not found

        close = difflib.get_close_matches(command, ("python", "python3", "bash", "sh"), n=1)
        why = f"{command!r} is not on the workers' PATH ({search[:120]})"
        hint = f"; did you mean {close[0]!r}?" if close else ""
    raise SpecError([Problem(*spec.where(("program", "argv")), "program.argv",
                             f"{why}; the workers must be able to run it (python, a path, or a "
                             f"name on their PATH){hint}")])


def check_worker_is_podlaunchs(spec, pythonpath: str | None = None) -> None:
    """For workers on this machine's filesystem (local, Slurm): the first module named
    ``worker`` on the workers' ``PYTHONPATH`` must be podlaunch's, or none (then podlaunch's
    installed one is found after it): a user's package named ``worker`` there replaced
    podlaunch's worker in every process (``python -m worker`` ran the user's).

    Args:
      spec: the job.
      pythonpath: the workers' PYTHONPATH (default: cluster.env's, else this environment's).

    Raises:
      SpecError: another ``worker`` comes first, at ``cluster.env.PYTHONPATH``.
    """
    if not spec.worker_modules:  # a program imports podlaunch.program, never ``worker`` by name
        return
    said = "cluster.env.PYTHONPATH" if "PYTHONPATH" in spec.cluster.env else "PYTHONPATH"
    if pythonpath is None:
        pythonpath = spec.cluster.env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
    ours = os.path.realpath(os.path.dirname(worker_package.__file__))
    for entry in (pythonpath or "").split(os.pathsep):
        try:
            found = importlib.machinery.PathFinder.find_spec("worker", [os.path.abspath(entry)]) \
                if entry else None
        except (ImportError, ValueError):
            found = None
        if found is None:
            continue
        where = (found.submodule_search_locations or [os.path.dirname(found.origin or entry)])[0]
        if os.path.realpath(where) == ours:
            return
        shown = found.origin if found.submodule_search_locations is None else where
        raise SpecError([Problem(*spec.where(("cluster", "env", "PYTHONPATH")), said,
                                 f"{shown} is a module named worker on the workers' "
                                 f"{said} (in {entry}), before podlaunch's: every process "
                                 "would run it instead of podlaunch's worker; rename it, or "
                                 f"take {entry} off {said}")])


def check_syncs(spec) -> None:
    """For ssh and tpu: refuse a sync (``program.dir``, ``cluster.sync_dir``) that could copy
    secrets to the hosts (``syncrules.check_source``): a home directory, or keys and
    credentials inside that the spec neither excludes nor includes by name.

    Raises:
      SpecError: one problem per refused directory, at its key.
    """
    problems = []
    sync_dir = spec.cluster.sync_dir  # ssh and tpu settings (SshSettings) have it
    if sync_dir:
        why = syncrules.check_source(os.path.expanduser(sync_dir), spec.cluster.sync_rules)
        if why:
            problems.append(Problem(*spec.where(("cluster", "sync_dir")), "cluster.sync_dir",
                                    why.replace("under include", "under cluster.sync_include")
                                    .replace("under exclude", "under cluster.sync_exclude")))
    for key, directory, rules in spec.synced_dirs:  # program.dir
        why = syncrules.check_source(directory, rules)
        if why:
            section = key.split(".")[0]
            problems.append(Problem(*spec.where(tuple(key.split("."))), key,
                                    why.replace("under include", f"under {section}.include")
                                    .replace("under exclude", f"under {section}.exclude")))
    if problems:
        raise SpecError(problems)
