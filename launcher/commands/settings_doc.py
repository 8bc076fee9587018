"""The settings table of docs/settings.md, rendered from the code's own declarations.

Every row (key path, default, type and allowed values, meaning) comes from a section's
``setting(default, check=, doc=)`` fields (``worker.contract.sections``, ``launcher.spec``, the
local backend's ``cluster:`` in ``launcher.backends.local.devices``): the doc text is the
one source, so the table is never edited by hand. ``docs/NAME.md`` in a doc text becomes
a link. The table stands between two markers in docs/settings.md; the prose around it is
kept. It lives here, on the commands' floor, because it reads both the spec and a backend.

    python -m launcher.commands.settings_doc           # rewrite docs/settings.md's table
    python -m launcher.commands.settings_doc --check   # exit 1, naming each row that differs

``tests/fitness/test_settings_doc.py`` fails when the committed file differs from this.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import types
import typing
from typing import Any, Literal

from launcher import backends, spec
from launcher.spec import schema

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                   "docs", "settings.md")
BEGIN = ("<!-- The table below is generated from the code's doc= texts: edit those, then run "
         "python -m launcher.commands.settings_doc -->")
END = "<!-- end of the generated table -->"
HEADER = "| key | default | type | meaning |\n|---|---|---|---|"
# sections shown as one row (its doc names the page of their keys): a program job's own
WHOLE = ("program",)
_LINK = re.compile(r"docs/([a-z0-9_-]+\.md)(#[a-z0-9-]+)?")
_KEY = re.compile(r"^\| `([^`]+)` \|")


def _fields(cls: type) -> list:
    return [f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")]


def _value(value: Any) -> str:
    """A default as YAML writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(f'"{v}"' if isinstance(v, str) else _value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return f"`{_value(field.default)}`"
    if field.default_factory is not dataclasses.MISSING:
        return f"`{_value(field.default_factory())}`"
    return "required"


def type_text(tp: Any, allowed: str = "") -> str:
    """A type hint in words, with what its check allows (``check.allowed``): the values a key
    takes."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        parts = [type_text(a, "" if typing.get_origin(a) is Literal else allowed)
                 for a in args if a is not type(None)]
        if type(None) in args:
            parts.append("null")
        return " or ".join(parts)
    if origin is Literal:
        words = [f"`{_value(a)}`" for a in args]
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
    if origin is tuple:  # tuple[str, ...]: a YAML list
        return f"list of {_plural(type_text(args[0]))}"
    if origin is dict:
        return "mapping" + ("" if args[1] is Any else f" to {_plural(type_text(args[1]))}")
    if tp is schema.EnvValue:
        return "string or integer"
    names = {int: "integer", float: "number", str: "string", bool: "boolean"}
    if tp in names:
        return names[tp] + (f" {allowed}" if allowed else "")
    if dataclasses.is_dataclass(tp):
        return "mapping"
    raise TypeError(f"no words for the type {tp!r}")  # a new kind of setting: say it here


def _plural(words: str) -> str:
    return " or ".join(word + "s" for word in words.split(" or "))


def meaning(doc: str) -> str:
    """A doc text as a table cell: ``docs/NAME.md#anchor`` a link, ``|`` and ``<`` escaped (a
    ``<run dir>`` would read as an HTML tag)."""
    return _LINK.sub(lambda m: f"[{m.group(1)}]({m.group(1)}{m.group(2) or ''})",
                     doc.replace("|", "\\|").replace("<", "&lt;"))


def _row(key: str, field: dataclasses.Field, tp: Any, given: str | None = None) -> str:
    allowed = getattr(field.metadata.get("check"), "allowed", "")
    return (f"| `{key}` | {given or default(field)} | {type_text(tp, allowed)} | "
            f"{meaning(field.metadata.get('doc', ''))} |")


def rows(local_cluster: type | None = None) -> list:
    """``(key, row)`` for every setting of a job on the local backend, in a spec file's order."""
    local_cluster = local_cluster or backends.get("local").cluster_type
    top = {}
    for cls in (spec.TrainerJobSpec, spec.ProgramJobSpec):
        hints = typing.get_type_hints(cls)
        for field in _fields(cls):
            top[field.name] = (field, hints[field.name])
    out = []
    for name in spec.SECTION_ORDER:
        field, tp = top.pop(name)
        section = local_cluster if name == "cluster" else tp
        if name in WHOLE:  # it makes the job a program job: absent from the trainer's
            out.append((name, _row(name, field, tp, given="none")))
            continue
        if not dataclasses.is_dataclass(section):
            out.append((name, _row(name, field, tp)))
            continue
        hints = typing.get_type_hints(section)
        for inner in _fields(section):
            key, inner_tp = f"{name}.{inner.name}", hints[inner.name]
            if key == "cluster.backend":  # the local one's class allows only local: any backend
                inner_tp = Literal[tuple(backends.names())]
            out.append((key, _row(key, inner, inner_tp)))
    assert not top, f"settings missing from spec.SECTION_ORDER: {sorted(top)}"
    return out


def table(local_cluster: type | None = None) -> str:
    return "\n".join([HEADER] + [row for _, row in rows(local_cluster)])


def rendered(text: str, local_cluster: type | None = None) -> str:
    """``text`` (docs/settings.md) with the table between the markers rendered anew."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n\n" + table(local_cluster) + "\n\n" + text[end:]


def differences(text: str, local_cluster: type | None = None) -> list:
    """How the table in ``text`` differs from the code's: one line per key, both texts."""
    def keyed(block: str) -> dict:
        return {m.group(1): line for line in block.splitlines() if (m := _KEY.match(line))}

    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    written, code = keyed(text[start:end]), dict(rows(local_cluster))
    found = [f"{key}: the code has no such setting; docs/settings.md says:\n  {written[key]}"
             for key in written if key not in code]
    for key, row in code.items():
        if key not in written:
            found.append(f"{key}: missing from docs/settings.md; the code says:\n  {row}")
        elif written[key] != row:
            found.append(f"{key}: docs/settings.md says:\n  {written[key]}\nthe code says:\n  {row}")
    if not found and text != rendered(text, local_cluster):
        found.append("the table's header, order or spacing differs from the code's rendering")
    return found


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.commands.settings_doc",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming each row that differs")
    args = parser.parse_args(argv)
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    if args.check:
        found = differences(text)
        print("\n".join(found) if found else "docs/settings.md's table is the code's")
        return 1 if found else 0
    new = rendered(text)
    if new != text:
        with open(DOC, "w", encoding="utf-8") as f:
            f.write(new)
    print(f"{DOC}: {'rewritten' if new != text else 'already the code'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
