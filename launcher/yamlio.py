"""YAML reading that means what the user sees, with a line number for every key.

PyYAML implements YAML 1.1, whose implicit typing surprises people who write
specs by hand. This loader keeps PyYAML's parser and swaps the implicit
resolvers for YAML 1.2's core schema (https://yaml.org/spec/1.2.2/#103-core-schema):

==================  ====================  ===================================
written             YAML 1.1 (PyYAML)     here
==================  ====================  ===================================
``yes no on off``   booleans              strings (only true/false are bools)
``1e-3``            the string '1e-3'     the float 0.001
``0755``            octal 493             a string (an int field says why)
``1_000``           1000                  a string
``12:30``           sexagesimal 750       a string
``2024-01-01``      a datetime.date       a string
duplicate keys      last one wins         an error naming both lines
==================  ====================  ===================================
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from launcher.errors import Problem

_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_NULL = "tag:yaml.org,2002:null"


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema implicit typing."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers
            if tag.rsplit(":", 1)[-1] in ("null", "merge", "yaml")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9]*)|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"))
_Loader.add_implicit_resolver(
    _FLOAT, re.compile(r"^(?:[-+]?(?:\.[0-9]+|(?:0|[1-9][0-9]*)(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+.0123456789"))


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    return int(text, 0) if text.startswith("0x") else int(text)


_Loader.add_constructor(_INT, _construct_int)

Lines = dict  # tuple[str | int, ...] -> int (1-based line of the key or item)


def load(text: str, source: str) -> tuple[Any, Lines]:
    """Parse YAML text into plain Python values plus a line for every key path.

    Args:
      text: the YAML document.
      source: the file name used in error messages.

    Returns:
      (value, lines): ``value`` built from dicts, lists, str, int, float, bool
      and None; ``lines`` maps each key path (a tuple of keys and list indices)
      to the 1-based line where it is written.

    Raises:
      SpecError: a syntax error, a duplicate key, or a key that is not a string.
    """
    from launcher.errors import SpecError

    loader = _Loader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        raise SpecError([Problem(source, line, "", f"not valid YAML: {what}")]) from None
    finally:
        loader.dispose()
    if node is None:
        return None, {}
    lines: Lines = {}
    problems: list[Problem] = []
    value = _build(loader, node, (), lines, problems, source)
    if problems:
        raise SpecError(problems)
    return value, lines


def _build(loader, node, path, lines, problems, source):
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # resolves "<<" merge keys
        out: dict = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                problems.append(Problem(source, line, dotted(path),
                                        f"key {key!r} is not a string; quote it"))
                continue
            if key in out:
                problems.append(Problem(
                    source, line, dotted(path + (key,)),
                    f"duplicate key (first written on line {lines[path + (key,)]}); "
                    "keep one"))
                continue
            lines[path + (key,)] = line
            out[key] = _build(loader, value_node, path + (key,), lines, problems, source)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            lines[path + (index,)] = item.start_mark.line + 1
            items.append(_build(loader, item, path + (index,), lines, problems, source))
        return items
    return loader.construct_object(node, deep=True)


def load_scalar(text: str) -> Any:
    """Parse one ``--set`` value with the same typing rules as files."""
    value, _ = load(text, "--set")
    return "" if value is None and text.strip() == "" else value


def dotted(path: tuple) -> str:
    """Format a key path: ``('cluster', 'hosts', 2, 'port')`` -> ``cluster.hosts[2].port``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out
