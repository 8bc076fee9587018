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

Merge keys (``<<: *defaults``) work as in PyYAML and YAML tools: the mapping's
own keys win over merged ones, and a merged mapping may merge others itself
(layered defaults). A tag other than the plain ones (``!foo``, ``!!timestamp``,
``!!int abc``) is an error line, never a traceback. What a document may expand to is bounded, so a
hostile spec is one error line, not a hang or a traceback: at most
``MAX_CHARS`` characters, at most ``MAX_NODES`` nodes as written (counted while
PyYAML composes them: a list of 12 million items once took 4.2 GB and minutes
before any check), at most ``MAX_VALUES`` values after aliases are expanded (a
"billion laughs" alias bomb stops there), at most ``MAX_DEPTH`` levels of
nesting, and no alias inside the value it names (a recursive alias).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from launcher.errors import Problem
from worker.contract import redact

_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_NULL = "tag:yaml.org,2002:null"
_MERGE = "tag:yaml.org,2002:merge"
_PLAIN = frozenset({"tag:yaml.org,2002:str", _BOOL, _INT, _FLOAT, _NULL})  # what a spec holds
_WORDS = {_INT: "a whole number", _FLOAT: "a number", _BOOL: "true or false", _NULL: "null"}
_BAD = object()  # a scalar that could not be read (the problem is said)


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema implicit typing, and a bound on the nodes it
    composes (``MAX_NODES``)."""

    nodes = 0

    def compose_node(self, parent, index):
        self.nodes += 1
        if self.nodes > MAX_NODES:
            mark = self.peek_event().start_mark
            raise _TooBig(mark.line + 1, f"holds more than {MAX_NODES:,} values; a spec names "
                          "its data (data.path), it does not hold it: move the values to a file")
        return super().compose_node(parent, index)


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

MAX_VALUES = 100_000
MAX_NODES = 60_000  # as written, keys too (a mapping of k keys is 2k + 1); 1,024 hosts: ~5,000
MAX_CHARS = 2 << 20  # a spec of 1,024 hosts is about 100 KB
MAX_DEPTH = 64


# PyYAML's words for the usual slips, and what the user usually did (the words stay shown)
YAML_HINTS = (
    ("mapping values are not allowed here", "usually a ': ' inside a value: quote the value, "
     "e.g. cmd: 'a: b'"),
    ("cannot start any token", "usually a tab: YAML indents with spaces only"),
    ("could not find expected ':'", "usually a key without ': ', or a line indented unlike "
     "the lines around it"),
    ("expected <block end>", "usually a line indented unlike its siblings: align it with them"),
    ("did not find expected key", "usually a line indented unlike its siblings: align it with "
     "them"),
    ("found undefined alias", "a *name with no &name anchor earlier in the file"),
    ("found unexpected end of stream", "usually a quote or bracket opened and never closed"),
    ("expected ',' or ']'", "usually a [ list never closed, or an item with a ':' or ',' to "
     "quote"),
    ("expected ',' or '}'", "usually a { mapping never closed, or a value with a ':' or ',' "
     "to quote"),
)


class Lines(dict):
    """Key path (tuple of keys and list indices) -> 1-based line of the key or item.

    ``texts`` maps the path of every number to its text as written (``0x1F``,
    ``+7``), for settings that must pass a value exactly as the user wrote it.
    """

    def __init__(self, *args):
        super().__init__(*args)
        self.texts: dict = {}


class _TooBig(Exception):
    """The document expands past a bound; the message says which."""

    def __init__(self, line: int | None, message: str):
        super().__init__(message)
        self.line, self.message = line, message


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

    if len(text) > MAX_CHARS:
        raise SpecError([Problem(source, None, "", f"is {len(text) / (1 << 20):.1f} MiB; a spec "
                                 f"is at most {MAX_CHARS >> 20} MiB (it names its data, it does "
                                 "not hold it): move the values to a file")])
    try:
        loader = _Loader(text)  # its reader refuses control characters here, before parsing
    except yaml.reader.ReaderError as exc:
        raise SpecError([_unreadable(source, text, exc)]) from None
    try:
        node = loader.get_single_node()
    except _TooBig as exc:
        raise SpecError([Problem(source, exc.line, "", exc.message)]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        hint = next((h for words, h in YAML_HINTS if words in what), "")
        raise SpecError([Problem(source, line, "", f"not valid YAML: {what}"
                                 + (f" ({hint})" if hint else ""))]) from None
    except RecursionError:  # PyYAML's composer recurses once per nesting level
        raise SpecError([Problem(source, None, "", f"nested too deeply to read (more than "
                                 f"{MAX_DEPTH} levels are refused); flatten the document")]) from None
    finally:
        loader.dispose()
    if node is None:
        return None, Lines()
    lines = Lines()
    problems: list[Problem] = []
    builder = _Builder(loader, lines, problems, source)
    try:
        value = builder.build(node, ())
    except _TooBig as exc:
        raise SpecError([Problem(source, exc.line, "", exc.message)]) from None
    if problems:
        raise SpecError(problems)
    return value, lines


def _unreadable(source: str, text: str, exc: "yaml.reader.ReaderError") -> Problem:
    """A character YAML does not allow (a control character), by line and column."""
    before = text[:exc.position]
    line, column = before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1
    return Problem(source, line, "", f"column {column}: the character U+{exc.character if isinstance(exc.character, int) else ord(exc.character):04X} "
                   "is not allowed in YAML (control characters other than tab and newline "
                   "are not); remove it, or write it as an escape inside double quotes")


class _Builder:
    """Plain values from composed nodes, with lines, merges and bounds."""

    def __init__(self, loader, lines: Lines, problems: list, source: str):
        self.loader, self.lines, self.problems, self.source = loader, lines, problems, source
        self.count = 0
        self.open: set = set()  # ids of the nodes being built (an alias among them is recursive)

    def build(self, node, path: tuple):
        line = node.start_mark.line + 1
        self.count += 1
        if self.count > MAX_VALUES:
            raise _TooBig(line, f"expands to more than {MAX_VALUES:,} values once aliases are "
                          "expanded (an alias bomb?); write the values out or use fewer aliases")
        if len(path) > MAX_DEPTH:
            raise _TooBig(line, f"nested more than {MAX_DEPTH} levels deep at {dotted(path)}; "
                          "flatten the document")
        if id(node) in self.open:
            raise _TooBig(line, f"{dotted(path) or 'the document'}: an alias refers to a value "
                          "that contains it (a recursive alias); write the value out")
        if isinstance(node, yaml.MappingNode):
            self.open.add(id(node))
            try:
                return self._mapping(node, path)
            finally:
                self.open.discard(id(node))
        if isinstance(node, yaml.SequenceNode):
            self.open.add(id(node))
            try:
                items = []
                for index, item in enumerate(node.value):
                    self.lines[path + (index,)] = item.start_mark.line + 1
                    items.append(self.build(item, path + (index,)))
                return items
            finally:
                self.open.discard(id(node))
        value = self._scalar(node, path)
        if value is _BAD:
            return None  # said in problems
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self.lines.texts[path] = node.value
        return value

    def _scalar(self, node, path: tuple):
        """A scalar's value; a tag this loader does not read (``!foo``, ``!!timestamp``, ``!!int
        abc``) or a string that is not text (a lone surrogate) is a problem with its line, not
        a traceback later (``_BAD`` then)."""
        untagged = ("; write the value without a tag (a spec holds strings, numbers, true/false, "
                    "null, lists and mappings)")
        shown = node.tag.replace("tag:yaml.org,2002:", "!!")
        secret = secret_path(path)  # its text is not repeated: a tag or a value may be it
        if secret and node.tag not in _PLAIN:
            shown = "(not shown: the key is a secret)"
        if node.tag not in _PLAIN:
            why = f"the tag {shown} is not read here{untagged}"
        else:
            try:
                value = self.loader.construct_object(node, deep=True)
                if isinstance(value, str):
                    value.encode("utf-8")  # "\uD800": half a UTF-16 pair, no text to write back
                return value
            except UnicodeEncodeError as exc:
                why = (f"{node.value!r:.60} holds {exc.object[exc.start]!r}, half of a UTF-16 "
                       "surrogate pair, which is not text; write the character itself, or its "
                       "\\U00XXXXXX escape")
            except (yaml.YAMLError, ValueError, TypeError, AttributeError):
                why = (f"{'its value' if secret else repr(node.value)[:60]} is not "
                       f"{_WORDS.get(node.tag, shown)}{untagged}")
        self.problems.append(Problem(self.source, node.start_mark.line + 1, dotted(path), why))
        return _BAD

    def _merged(self, key_node, value_node, path: tuple) -> list:
        """The (key, value node) pairs a ``<<`` brings, in the order they win: each source's
        own keys before those it merges itself (``x-cpu: &cpu {<<: *base, ...}``, then
        ``train: {<<: *cpu}``), an earlier source before a later one."""
        sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        pairs: list = []
        for source in sources:
            if not isinstance(source, yaml.MappingNode) or id(source) in self.open:
                self.problems.append(Problem(
                    self.source, key_node.start_mark.line + 1, dotted(path),
                    "'<<' merges mappings only; give it an alias of a mapping"
                    if not isinstance(source, yaml.MappingNode) else
                    "'<<' merges a mapping into itself (a recursive alias); write the keys out"))
                continue
            self.open.add(id(source))
            try:
                own = [(k, v) for k, v in source.value if k.tag != _MERGE]
                for k, v in source.value:
                    if k.tag == _MERGE:
                        own += self._merged(k, v, path)
            finally:
                self.open.discard(id(source))
            pairs += own
        return pairs

    def _mapping(self, node, path: tuple) -> dict:
        out: dict = {}
        merged: list = []  # (key, value node) from "<<" merges: the mapping's own keys win
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                merged += self._merged(key_node, value_node, path)
                continue
            key = self._scalar(key_node, path) if isinstance(key_node, yaml.ScalarNode) \
                else self.loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key is _BAD:
                continue
            if not isinstance(key, str):
                self.problems.append(Problem(self.source, line, dotted(path),
                                             f"key {key!r} is not a string; quote it"))
                continue
            if key in out:
                self.problems.append(Problem(
                    self.source, line, dotted(path + (key,)),
                    f"duplicate key (first written on line {self.lines[path + (key,)]}); keep one"))
                continue
            self.lines[path + (key,)] = line
            out[key] = self.build(value_node, path + (key,))
        for key_node, value_node in merged:  # earlier merge sources win over later ones
            key = self._scalar(key_node, path) if isinstance(key_node, yaml.ScalarNode) \
                else self.loader.construct_object(key_node, deep=True)
            if isinstance(key, str) and key not in out:
                self.lines[path + (key,)] = key_node.start_mark.line + 1
                out[key] = self.build(value_node, path + (key,))
        return out


def load_scalar(text: str) -> Any:
    """Parse one ``--set`` value with the same typing rules as files."""
    value, _ = load(text, "--set")
    return "" if value is None and text.strip() == "" else value


def secret_path(path: tuple) -> bool:
    """Whether a key of ``path`` names a secret (``worker.contract.redact.is_secret``): a
    problem's message there must not repeat the value."""
    return any(isinstance(key, str) and redact.is_secret(key) for key in path)


def dotted(path: tuple) -> str:
    """Format a key path: ``('cluster', 'hosts', 2, 'port')`` -> ``cluster.hosts[2].port``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out
