"""A user's task function read from its source, not imported: does ``task.args`` fit it?

``task.name: package.module:function`` is called by every worker as ``function(**task.args)``;
an argument it does not take, or a required one missing, was a ``TypeError`` with a traceback
from every process after the start. Its module's source is parsed (``ast``: nothing of it
runs) and the function's parameters read, when it is a plain ``def`` at the module's top level;
a function made any other way (a decorator, an assignment, an import) is left to its start.
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
            tree = ast.parse(f.read(), origin)
    except (OSError, SyntaxError, ValueError):
        return []  # the workers' import says what is wrong with it
    found = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             and node.name == function]
    if len(found) != 1 or found[0].decorator_list:
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
