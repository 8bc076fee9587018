"""Turn plain YAML values into frozen dataclasses, collecting every problem.

A spec section is a frozen dataclass whose fields carry a ``check`` and a
``doc`` in their metadata (see ``setting``). ``build`` walks a dataclass's
type hints, converts and checks each value, rejects unknown keys with a
did-you-mean, and records problems instead of raising at the first one.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from typing import Any, Literal

from launcher.errors import Problem
from launcher.spec.yamlio import dotted, secret_path
# the job's sections and their checks are the worker's too (worker.contract.sections): declared
# once, and imported from there by every module that declares a setting
from worker.contract.sections import MISSING
from worker.contract.valuechecks import Check, allows, identifier


# ---- checks: return None when fine, else "expected ..." -------------------
@allows("0 to 65535")
def port_or_zero(value) -> str | None:
    if 0 <= value <= 65535:
        return None
    return f"expected a TCP port 1-65535 (or 0 to pick a free one at launch), got {value}"


# Environment variables the launcher sets itself; a user value would break the
# worker's identity or its devices (names, and prefixes ending in "_").
RESERVED_ENV = ("PODLAUNCH_", "JAX_PLATFORMS", "JAX_PLATFORM_NAME", "JAX_NUM_CPU_DEVICES",
                "JAX_COORDINATOR_ADDRESS", "MEGASCALE_", "PYTHONUNBUFFERED")


def env_names(env: dict) -> str | None:
    """Check of an ``env`` mapping: every key a variable name, none the launcher's own."""
    for name in env:
        problem = _ENV_NAME(name)
        if problem:
            return problem
        reserved = [r for r in RESERVED_ENV if name == r or (r.endswith("_") and name.startswith(r))]
        if reserved:
            return (f"{name!r} is set by podlaunch itself for every worker (reserved: "
                    f"{', '.join(n + ('*' if n.endswith('_') else '') for n in RESERVED_ENV)}); "
                    "remove it or rename it")
    return None


def each(check: Check) -> Check:
    """``check`` applied to every item of a list setting; the first problem names its index."""
    def check_all(values) -> str | None:
        for index, value in enumerate(values):
            problem = check(value)
            if problem:
                return f"item {index}: {problem}"
        return None
    return check_all


_PATH_CHARS = r"[A-Za-z0-9_./~+@%,:=-]"
_ENV_NAME = identifier("environment variable name", r"[A-Za-z_][A-Za-z0-9_]*",
                       "letters, digits and '_', not starting with a digit", r"[A-Za-z0-9_]")
HOST = identifier("a host name or address", r"[A-Za-z0-9_][A-Za-z0-9_.-]*|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*",
                  "letters, digits, '.', '-', '_', or an IPv6 address", r"[A-Za-z0-9_.:-]")
USER = identifier("a user name", r"[A-Za-z0-9_][A-Za-z0-9_.-]*", "letters, digits, '.', '-', '_'",
                  r"[A-Za-z0-9_.-]")
REMOTE_PATH = identifier("a path", r"[A-Za-z0-9_./~+@%,:=][A-Za-z0-9_./~+@%,:=-]*",
                         "letters, digits and _ . / ~ + @ % , : = -, not starting with '-'", _PATH_CHARS)
COMMAND = identifier("a command or path", r"[A-Za-z0-9_./~+@%,:=][A-Za-z0-9_./~+@%,:=-]*",
                     "letters, digits and _ . / ~ + @ % , : = -, not starting with '-'", _PATH_CHARS)
GCP_NAME = identifier("a Cloud resource name", r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?",
                      "lowercase letters, digits and '-', starting with a letter, at most 63",
                      r"[-a-z0-9]")
GCP_ZONE = identifier("a Cloud zone", r"[a-z]+(-[a-z0-9]+)+", "e.g. us-central2-b", r"[-a-z0-9]")
GCP_PROJECT = identifier("a Cloud project id", r"[a-z][-a-z0-9.:]{0,61}[a-z0-9]",
                         "lowercase letters, digits, '-', and for domain-scoped ids '.' and ':'",
                         r"[-a-z0-9.:]")


def non_empty(value) -> str | None:
    return None if value.strip() else "expected a non-empty string"


class EnvValue(str):
    """Type marker: an environment value, written as a string or an integer."""


# ---- building --------------------------------------------------------------
class Context:
    """Collects problems, with the source and line of each key path."""

    def __init__(self, lines: dict, sources: dict, default_source: str):
        self.lines = lines          # path tuple -> line
        self.sources = sources      # path tuple -> source (for --set / cluster file)
        self.default_source = default_source
        self.problems: list[Problem] = []

    def where(self, path: tuple) -> tuple[str, int | None]:
        """The source (file or ``--set``) and line that gave the value at ``path``."""
        source = self.default_source
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.sources:
                source = self.sources[path[:cut]]
                break
        if source == "--set":
            return source, None
        for cut in range(len(path), 0, -1):
            if path[:cut] in self.lines:
                return source, self.lines[path[:cut]]
        return source, None

    def error(self, path: tuple, message: str) -> None:
        """A problem at ``path``; the value the message quotes after "got" is masked: shown as
        ``****`` under a secret key (``cluster.env.DB_PASSWORD``), else its credentials
        (``Bearer T``, ``--token=T``, a URL's password: ``redact.mask_text``) wherever it is."""
        from worker.contract import redact

        source, line = self.where(path)
        message = _GOT_VALUE.sub("got ****" if secret_path(path) else
                                 lambda m: redact.mask_text(m.group(0)), message)
        self.problems.append(Problem(source, line, dotted(path), message))


# "got 'x' (a string)", "got 12.5 (a number)", "got True": the value a message quotes
_GOT_VALUE = re.compile(r"got (?!a list\b|a mapping\b|null\b)(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s;,()]+)")


def describe(value: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a mapping", type(None): "null"}.get(type(value), "a value")
    shown = repr(value) if not isinstance(value, (dict, list)) else kind
    return shown if isinstance(value, (dict, list)) else f"{shown} ({kind})"


def _hint(expected: str, value: Any) -> str:
    """Explain YAML traps when a string arrived where a number or bool was meant."""
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in ("yes", "no", "on", "off", "y", "n"):
            return " (YAML 1.1 read this as a boolean; podlaunch reads only true/false as booleans)"
        if value.isdigit() and value.startswith("0"):
            return f" (leading zeros are ambiguous: YAML 1.1 reads them as octal; write {int(value)} or 0o{value[1:]})"
        if "_" in value and value.replace("_", "").isdigit():
            return f" (write {value.replace('_', '')} without underscores)"
        if ":" in value and all(p.isdigit() for p in value.split(":")):
            return " (YAML 1.1 reads this as a base-60 number; quote it or write the value)"
    return ""


# the lists that are a command's words (no shell): a string given there is shown split
COMMANDS = {("notify", "command"), ("program", "argv")}


def _list_form(path: tuple, value: Any) -> str:
    """A string where a list was expected, masked as the list's words are: ``got ...`` and the
    list it was meant as, to paste (a command's words split as a shell would; any other list,
    the string as its one item). Anything else: ``got`` and its kind."""
    if not isinstance(value, str):
        return f"got {describe(value)}"
    import json
    import shlex

    from worker.contract import redact

    try:
        items = shlex.split(value) if tuple(path[-2:]) in COMMANDS else [value]
    except ValueError:  # an unbalanced quote
        items = [value]
    what = "a list of the command's words (no shell runs it)" if len(items) > 1 else "a list"
    shown = ["****"] * len(items) if secret_path(path) else redact.masked_argv(items)
    # the string itself as its masked words: a token in it is never printed whole
    got = " ".join(shlex.quote(word) if not word or any(c.isspace() or c in "'\"" for c in word)
                   else word for word in shown) if len(items) > 1 else shown[0]
    return f"got {describe(got)}; write it as {what}: {json.dumps(shown)}"


def convert(tp: Any, value: Any, path: tuple, ctx: Context) -> Any:
    """Convert ``value`` to type ``tp``; on failure record a problem and return MISSING."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        literal = next((a for a in inner if typing.get_origin(a) is Literal), None)
        if literal is not None and len(inner) > 1:  # int | Literal["auto"]: a word, or the other
            if isinstance(value, str):
                if value in typing.get_args(literal):
                    return value
                others = " or ".join(_expected(a) for a in inner if a is not literal)
                ctx.error(path, f"expected {others} or one of "
                          f"{', '.join(map(str, typing.get_args(literal)))}, got {describe(value)}")
                return MISSING
            inner = [a for a in inner if a is not literal]
        return convert(inner[0], value, path, ctx)
    if value is None:
        ctx.error(path, f"expected {_expected(tp)}, got null; remove the key to use the default")
        return MISSING
    if origin is Literal:
        if value in args:
            return value
        close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
        tip = f"; did you mean {close[0]!r}?" if close else ""
        ctx.error(path, f"expected one of {', '.join(map(str, args))}, got {describe(value)}{tip}")
        return MISSING
    if tp is bool:
        if isinstance(value, bool):
            return value
        ctx.error(path, f"expected true or false, got {describe(value)}{_hint('bool', value)}")
        return MISSING
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        tip = f" (write {int(value)})" if isinstance(value, float) and value.is_integer() else ""
        ctx.error(path, f"expected an integer, got {describe(value)}{tip or _hint('int', value)}")
        return MISSING
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
            ctx.error(path, f"expected a finite number, got {value!r}")
            return MISSING
        ctx.error(path, f"expected a number, got {describe(value)}{_hint('float', value)}")
        return MISSING
    if tp is EnvValue:
        if isinstance(value, int) and not isinstance(value, bool):
            # passed exactly as written: 0x1F stays "0x1F", +7 stays "+7"
            return getattr(ctx.lines, "texts", {}).get(path, str(value))
        if isinstance(value, str):
            return value
        ctx.error(path, f"expected a string or an integer, got {describe(value)}; quote it so "
                  "it reaches the worker exactly as written")
        return MISSING
    if tp is str:
        if isinstance(value, str):
            return value
        ctx.error(path, f"expected a string, got {describe(value)}; quote it if you meant text")
        return MISSING
    if tp is Any:
        return value
    if origin is tuple:
        if not isinstance(value, list):
            ctx.error(path, f"expected a list, {_list_form(path, value)}")
            return MISSING
        out = [convert(args[0], item, path + (i,), ctx) for i, item in enumerate(value)]
        return MISSING if any(o is MISSING for o in out) else tuple(out)
    if origin is dict:
        if not isinstance(value, dict):
            ctx.error(path, f"expected a mapping, got {describe(value)}")
            return MISSING
        return {k: convert(args[1], v, path + (k,), ctx) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path, ctx)
    raise TypeError(f"unsupported spec type {tp!r}")  # a bug in a schema, not user input


def _expected(tp: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    return names.get(tp, "a mapping" if dataclasses.is_dataclass(tp) else "a value")


def build(cls: type, raw: Any, path: tuple, ctx: Context) -> Any:
    """Build dataclass ``cls`` from mapping ``raw``; problems go to ``ctx``.

    Returns the instance, or MISSING when any of its fields had a problem.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        ctx.error(path, f"expected a mapping of settings, got {describe(raw)}")
        return MISSING
    hints = typing.get_type_hints(cls)
    # "internal" fields (the spec's own file name) are set by the loader, never by the user
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")}
    for key in raw:
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
            tip = f"did you mean {close[0]!r}?" if close else \
                f"known keys: {', '.join(sorted(fields))}"
            ctx.error(path + (key,), f"unknown key; {tip}")
    values: dict[str, Any] = {}
    ok = True
    for name, field in fields.items():
        if name not in raw:
            if field.default is MISSING and field.default_factory is MISSING:
                ctx.error(path + (name,), f"missing; expected {_expected(hints[name])}"
                          + (f" ({field.metadata['doc']})" if field.metadata.get("doc") else ""))
                ok = False
            continue
        value = convert(hints[name], raw[name], path + (name,), ctx)
        if value is MISSING:
            ok = False
            continue
        check = field.metadata.get("check")
        if check is not None and value is not None:
            message = check(value)
            if message:
                ctx.error(path + (name,), message)
                ok = False
                continue
        values[name] = value
    if not ok or any(key not in fields for key in raw):
        return MISSING
    return cls(**values)


def given(raw: Any, key: str) -> bool:
    """Whether the user wrote ``key`` in mapping ``raw``."""
    return isinstance(raw, dict) and key in raw


def relative_to(ctx: "Context", key: tuple) -> str:
    """What a relative local path at ``key`` was taken relative to, in words: the spec file's
    directory, or the shell's for one given with ``--set`` (``launcher.spec.SHELL_PATHS``)."""
    if ctx.where(key)[0] == "--set":
        return "a path given with --set is relative to the directory launch runs in"
    return "paths are relative to the spec file"
