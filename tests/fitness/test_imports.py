"""The code's imports: nothing heavy at start-up, every module on its floor, no import to a
higher floor and no cycle.

``launch --help`` and a local launch must not pay for jax, numpy,
tensorboardX or the SSH libraries (the workers import jax; fabric is imported
only when a spec names an ssh or tpu cluster). And the modules stand on floors
(``FLOORS``, bottom to top): a module imports its own floor and those below, never one
above, counted from every import in its file (inside functions too); within a floor a
cycle, even through an import inside a function, means two modules that cannot be
understood (or loaded) one without the other.
"""

from __future__ import annotations

import ast
import glob
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = ("jax", "numpy", "tensorboardX", "fabric", "paramiko")
PACKAGES = ("worker", "podlaunch", "launcher")  # what the floors hold: all of the product's code

# The floors, bottom to top: (name, the modules on it). A name stands for the module and the
# modules under it (``launcher.console`` is the console package), but a top-level package
# (``worker``) for its ``__init__`` alone; a module is on the floor of the longest name that
# covers it, and every module must be on one, so a new worker module is placed by hand. A
# module may import its own floor and the floors below; docs/development.md draws the map.
FLOORS = (
    # the worker: what runs on each host, in parts; it never imports the launcher
    ("worker contract", ("worker", "worker.contract")),
    ("worker runtime", ("worker.runtime",)),
    ("worker telemetry", ("worker.telemetry",)),
    ("worker data", ("worker.data",)),
    ("worker recovery", ("worker.recovery",)),
    ("worker trainer", ("worker.trainer", "worker.tasks")),
    ("worker entry points", ("worker.__main__", "worker.program", "podlaunch",
                             "podlaunch.program")),
    # the launcher, over the worker's contract (and the few worker parts it reads)
    ("launcher shared words", ("launcher.words", "launcher.errors",
                               "launcher.flags", "launcher.proctl", "launcher.logtimes",
                               "launcher.interrupts", "launcher.versions",
                               "launcher.tpu_topology", "launcher.owned", "launcher.rundir.runlock",
                               "launcher.remote",
                               "launcher.ports")),
    ("spec", ("launcher.spec",)),
    ("plan", ("launcher.plan", "launcher.stats", "launcher.ends", "launcher.state")),
    ("console", ("launcher.console",)),
    ("run directory", ("launcher.rundir",)),
    ("backends", ("launcher.backends",)),
    ("run", ("launcher.run",)),
    ("commands", ("launcher.commands",)),
    ("cli", ("launcher.cli",)),
)


@pytest.mark.parametrize("code", [
    "import launcher.cli",
    # what `launch jobs/linear.yaml` imports before its workers start
    "import launcher.cli, launcher.backends; launcher.backends.get('local')",
])
def test_the_launcher_imports_no_heavy_library(code):
    probe = (f"{code}; import sys; "
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"{code} imported {done.stdout.strip()}"


def _module_names(root: str = REPO, packages: tuple = PACKAGES) -> dict:
    """{dotted module name: path} of every module of ``packages`` under ``root`` (packages by
    their __init__)."""
    modules = {}
    for package in packages:
        for path in sorted(glob.glob(os.path.join(root, package, "**", "*.py"), recursive=True)):
            parts = os.path.relpath(path, root)[:-len(".py")].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_lines(name: str, path: str, modules: dict) -> list:
    """[(module imported, line, the import statement)] for every import of one of ``modules``
    anywhere in ``name``'s file (functions too; relative ones resolved), except under ``if
    TYPE_CHECKING:``, which never runs."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found: list = []

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in modules:  # an attribute of a module: the module
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((resolve(alias.name), node))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.append((resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in modules
                              else resolve(base), node))
        for child in ast.iter_child_nodes(node):
            visit(child)

    with open(path, encoding="utf-8") as f:
        visit(ast.parse(f.read(), filename=path))
    return [(m, node.lineno, ast.unparse(node)) for m, node in found
            if m is not None and m != name]


def _imports(name: str, path: str, modules: dict) -> set:
    """The modules ``name`` imports anywhere in its file (``_import_lines``, as a set)."""
    return {m for m, _, _ in _import_lines(name, path, modules)}


def floor_of(name: str) -> int | None:
    """The index in ``FLOORS`` of module ``name``'s floor (the longest name covering it), or
    None when no floor holds it."""
    best = None
    for index, (_, names) in enumerate(FLOORS):
        for floor_name in names:
            covers = name == floor_name or (floor_name not in PACKAGES
                                            and name.startswith(floor_name + "."))
            if covers and (
                    best is None or len(floor_name) > len(best[1])):
                best = (index, floor_name)
    return None if best is None else best[0]


def upward_imports(root: str = REPO) -> list:
    """Every import under ``root`` that runs to a higher floor, and every module on no floor,
    as one line each (file:line: the import, both floors)."""
    modules = _module_names(root)
    found = [f"{os.path.relpath(path, root)}: {name} is on no floor (add it to FLOORS in "
             "tests/fitness/test_imports.py)" for name, path in modules.items()
             if floor_of(name) is None]
    for name, path in modules.items():
        here = floor_of(name)
        for target, line, statement in _import_lines(name, path, modules):
            there = floor_of(target)
            if here is not None and there is not None and there > here:
                found.append(f"{os.path.relpath(path, root)}:{line}: {statement!r} imports "
                             f"{target} (floor {there}, {FLOORS[there][0]}) from {name} (floor "
                             f"{here}, {FLOORS[here][0]})")
    return found


def import_graph() -> dict:
    """{module: the modules it imports} over the launcher, the worker and podlaunch, the
    backend registry's included."""
    from launcher import backends

    modules = _module_names()
    graph = {name: _imports(name, path, modules) for name, path in sorted(modules.items())}
    # The registry imports backends by name (importlib), when a spec names one: still an edge.
    graph["launcher.backends"] |= {entry.partition(":")[0] for entry in backends.REGISTRY.values()}
    return graph


def find_cycle(graph: dict) -> list | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search)."""
    state: dict = {}  # name -> "open" while on the stack, "done" after
    stack: list = []

    def visit(name: str) -> list | None:
        state[name] = "open"
        stack.append(name)
        for other in sorted(graph.get(name, ())):
            if state.get(other) == "open":
                return stack[stack.index(other):] + [other]
            if other not in state:
                cycle = visit(other)
                if cycle:
                    return cycle
        stack.pop()
        state[name] = "done"
        return None

    for name in sorted(graph):
        if name not in state:
            cycle = visit(name)
            if cycle:
                return cycle
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]


def test_the_launcher_modules_import_each_other_without_a_cycle():
    graph = import_graph()
    assert "launcher.state" in graph["launcher.run.supervise"]
    assert "launcher.backends.local" in graph["launcher.backends"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_runs_to_a_higher_floor():
    upward = upward_imports()
    assert not upward, "imports to a higher floor (FLOORS, bottom to top):\n" + "\n".join(upward)


# What the launcher may import of the worker: its contract, and the tracker's TensorBoard
# writer for the ledger's goodput scalars at a run's end (the launcher writes them as the
# worker does)
LAUNCHER_READS = ("worker", "worker.contract", "worker.telemetry.tracker")


def test_the_launcher_reads_only_the_workers_contract():
    outside = sorted(f"{name} imports {target}" for name, targets in import_graph().items()
                     if name.startswith("launcher") for target in targets
                     if target.split(".")[0] == "worker"
                     and not any(target == r or (r != "worker" and target.startswith(r + "."))
                                 for r in LAUNCHER_READS))
    assert not outside, "the launcher imports the worker beyond its contract:\n" + "\n".join(outside)


def test_every_floor_is_named_once_and_in_the_code():
    names = [name for _, floor in FLOORS for name in floor]
    assert len(names) == len(set(names)), "a name on two floors"
    modules = _module_names()
    assert not [n for n in names if n not in modules], "a floor names a module that is gone"
    assert floor_of("launcher.console.status") == floor_of("launcher.console")
    assert floor_of("launcher.words") < floor_of("launcher.spec") < floor_of("launcher.cli")
    assert floor_of("worker.contract") == 0 and floor_of("launcher.cli") == len(FLOORS) - 1


def test_the_development_guide_lists_the_floors_in_order():
    with open(os.path.join(REPO, "docs", "development.md"), encoding="utf-8") as f:
        rows = [line.split("|")[1].strip() for line in f
                if line.startswith("| ") and not line.startswith("| floor ")]
    assert rows == [name for name, _ in FLOORS]


def test_an_upward_import_fails_naming_its_file_line_and_both_floors(tmp_path):
    """A broken copy of the code: the launcher's bottom floor imports the CLI inside a function,
    the console imports the run stage by a relative import, the worker's contract imports the
    launcher, and a new worker module stands on no floor; each is named, and nothing else."""
    for package in PACKAGES:
        shutil.copytree(os.path.join(REPO, package), tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    before = upward_imports(str(tmp_path))  # the code as it is (test_no_import_... judges it)
    broken = {"launcher/words.py": "\n\ndef _broken():\n    from launcher import cli\n",
              "launcher/console/lines.py": "\nfrom ..run import supervise\n",
              "worker/contract/__init__.py": "\nimport launcher.plan\n"}
    at = {}
    for path, text in broken.items():
        with open(tmp_path / path, "a", encoding="utf-8") as f:
            f.write(text)
        with open(tmp_path / path, encoding="utf-8") as f:
            at[path] = sum(1 for _ in f)
    (tmp_path / "worker" / "unplaced.py").write_text("")

    def floor(name: str) -> str:
        return f"(floor {floor_of(name)}, {FLOORS[floor_of(name)][0]})"

    assert sorted(upward_imports(str(tmp_path))) == sorted(before + [
        f"launcher/words.py:{at['launcher/words.py']}: 'from launcher import cli' imports "
        f"launcher.cli {floor('launcher.cli')} from launcher.words {floor('launcher.words')}",
        f"launcher/console/lines.py:{at['launcher/console/lines.py']}: 'from ..run import "
        f"supervise' imports launcher.run.supervise {floor('launcher.run.supervise')} from "
        f"launcher.console.lines {floor('launcher.console.lines')}",
        f"worker/contract/__init__.py:{at['worker/contract/__init__.py']}: 'import launcher.plan' imports "
        f"launcher.plan {floor('launcher.plan')} from worker.contract {floor('worker.contract')}",
        "worker/unplaced.py: worker.unplaced is on no floor (add it to FLOORS in "
        "tests/fitness/test_imports.py)"])


def test_imports_inside_functions_and_relative_ones_count_type_checking_ones_do_not(tmp_path):
    source = tmp_path / "b.py"
    source.write_text("from typing import TYPE_CHECKING\n"
                      "from . import c\n"
                      "if TYPE_CHECKING:\n    from launcher.pkg import d\n"
                      "def f():\n    from launcher.pkg.a import thing\n    import launcher.e.sub\n")
    modules = {m: "" for m in ("launcher.pkg", "launcher.pkg.a", "launcher.pkg.b", "launcher.pkg.c",
                               "launcher.pkg.d", "launcher.e")}
    assert _imports("launcher.pkg.b", str(source), modules) == {
        "launcher.pkg.a", "launcher.pkg.c", "launcher.e"}


def test_spec_loading_is_handed_the_backends_and_imports_none():
    # issue 24: the CLI hands the registry to spec loading; the spec module knows no backend
    code = ("import sys, launcher.spec; "
            "print(sorted(m for m in sys.modules if m.startswith('launcher.backends')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", out
    with open(os.path.join(REPO, "launcher", "commands", "launch.py"), encoding="utf-8") as f:
        assert "registry=backends" in f.read()
