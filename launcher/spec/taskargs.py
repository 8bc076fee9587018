"""A user's task function read from its source, not imported: does ``task.args`` fit it?

``task.name: package.module:function`` is called by every worker as ``function(**task.args)``;
an argument it does not take, or a required one missing, was a ``TypeError`` with a traceback
from every process after the start. Its module's source is parsed (``ast``: nothing of it
runs) and the function's parameters read, when it is a plain ``def`` at the module's top level
bound nowhere else; a function made any other way (a decorator, an assignment, an import, a
``def`` rebound to a wrapper) is left to its start.

A module that Python cannot compile (a syntax error, a NUL byte, an expression nested too
deep for the compiler) fails every worker's import: it is refused here, at its line, before
anything starts. The check compiles it as an import does (``compile``; nothing runs).
"""

from __future__ import annotations

import ast
import difflib

from launcher.errors import Problem


def problems(spec, origin: str) -> list:
    """``Problem``s of ``spec.task.args`` against the function ``spec.task.name`` names, as
    defined in the file ``origin`` (a ``.py`` file); [] when it fits or cannot be read."""
    function = spec.task.name.partition(":")[2]
    try:
        with open(origin, "rb") as f:
            source = f.read()
    except OSError:
        return []  # the workers' import says what is wrong with it
    tree, why = _compiled(source, origin)
    if tree is None:
        return [Problem(*spec.where(("task", "name")), "task.name",
                        f"{why}; every worker's import of it would fail: fix the module, then "
                        "launch again")]
    found = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             and node.name == function]
    if len(found) != 1 or found[0].decorator_list or _rebound(tree, function):
        return []
    params = found[0].args
    named = params.posonlyargs + params.args
    optional = {a.arg for a in named[len(named) - len(params.defaults):]} if params.defaults else set()
    optional |= {a.arg for a, d in zip(params.kwonlyargs, params.kw_defaults) if d is not None}
    takes = [a.arg for a in params.args + params.kwonlyargs]  # by keyword (not positional-only)
    args = spec.task.args or {}
    out = []
    if params.kwarg is None:
        for arg in args:
            if arg not in takes:
                close = difflib.get_close_matches(str(arg), takes, n=1)
                out.append(Problem(*spec.where(("task", "args", arg)), f"task.args.{arg}",
                                   f"{function}() in {origin}:{found[0].lineno} takes no argument "
                                   f"{arg!r}" + (f"; did you mean {close[0]!r}?" if close else
                                                 f"; it takes {', '.join(takes) or 'none'}")))
    for arg in takes:
        if arg not in optional and arg not in args:
            out.append(Problem(*spec.where(("task", "args")), "task.args",
                               f"{function}() in {origin}:{found[0].lineno} needs {arg}: add it "
                               f"under task.args"))
    return out


def _compiled(source: bytes, origin: str) -> tuple:
    """(the module's ``ast``, None), or (None, why Python cannot compile it: file, line and
    its words); compiled to bytecode as an import is, so nothing the import would refuse passes."""
    try:
        tree = ast.parse(source, origin)
        compile(tree, origin, "exec", dont_inherit=True)
    except SyntaxError as exc:  # IndentationError and TabError too
        where = f"{origin}:{exc.lineno}" if exc.lineno else origin
        return None, f"{where}: {type(exc).__name__}: {exc.msg}"
    except ValueError as exc:  # a NUL byte
        return None, f"{origin}: {exc}"
    except (RecursionError, MemoryError):
        return None, (f"{origin}: an expression is nested too deeply for Python to compile "
                      "(RecursionError); split it")
    return tree, None


def _rebound(tree: ast.Module, name: str) -> bool:
    """Whether the module binds ``name`` other than by its one ``def``: an assignment (a
    wrapper put in its place), an import, a class; then what runs is not that ``def``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name.split(".")[0]) == name for a in node.names):
            return True
        if isinstance(node, ast.ClassDef) and node.name == name:
            return True
    return False
