"""The launcher's imports: nothing heavy at start-up, and no cycle between its modules.

``launch --help`` and a local launch must not pay for jax, numpy,
tensorboardX or the SSH libraries (the workers import jax; fabric is imported
only when a spec names an ssh or tpu cluster). And the modules form layers:
state under status under console under supervise under restarts, backends
beside them; a cycle, even through an import inside a function, means two
modules that cannot be understood (or loaded) one without the other.
"""

from __future__ import annotations

import ast
import glob
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = ("jax", "numpy", "tensorboardX", "fabric", "paramiko")


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


def _module_names() -> dict:
    """{dotted module name: path} of every module under launcher/ (packages by their __init__)."""
    modules = {}
    for path in glob.glob(os.path.join(REPO, "launcher", "**", "*.py"), recursive=True):
        parts = os.path.relpath(path, REPO)[:-len(".py")].split(os.sep)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: str, modules: dict) -> set:
    """The launcher modules ``name`` imports anywhere in its file (functions too), except under
    ``if TYPE_CHECKING:``, which never runs."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found: set = set()

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
                found.add(resolve(alias.name))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in modules
                          else resolve(base))
        for child in ast.iter_child_nodes(node):
            visit(child)

    with open(path, encoding="utf-8") as f:
        visit(ast.parse(f.read(), filename=path))
    return {m for m in found if m is not None and m != name}


def import_graph() -> dict:
    """{launcher module: the launcher modules it imports}, the backend registry's included."""
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
    with open(os.path.join(REPO, "launcher", "cli.py"), encoding="utf-8") as f:
        assert "registry=backends" in f.read()
