"""Typed fields for the worker's side of the contract: runtime type checks of dataclasses.

``Identity`` (``worker.contract``) and the job's sections (``worker.contract.job``) check each
field's value against its annotation with these. Standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any


class ContractError(Exception):
    """What the launcher handed a worker does not fit this contract.

    A missing or malformed environment variable, or a job that lacks a key,
    has one too many, or holds a value of the wrong type; the message names
    the variable or the dotted key.
    """


@functools.lru_cache(maxsize=None)
def hints_of(cls) -> dict:
    return typing.get_type_hints(cls)


def allowed_types(hint) -> tuple:
    """The runtime types a field's annotation admits (an int is a float; a bool is no int;
    a ``Literal``'s, its values' types: ``literal_values`` says which values)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = typing.get_args(hint) if union else (hint,)
    out: list = []
    for option in options:
        if typing.get_origin(option) is typing.Literal:
            out += [type(v) for v in typing.get_args(option)]
            continue
        option = typing.get_origin(option) or option
        out += [int, float] if option is float else [type(None) if option is None else option]
    return tuple(out)


def literal_values(hint) -> tuple | None:
    """The values a ``Literal`` annotation (or a union holding one) admits, or None."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = typing.get_args(hint) if union else (hint,)
    literals = [v for o in options if typing.get_origin(o) is typing.Literal for v in typing.get_args(o)]
    return tuple(literals) if literals else None


def admits(hint, value: Any) -> bool:
    """Whether a field annotated ``hint`` may hold ``value``: its type is admitted and, where
    only a ``Literal`` admits that type (``int | Literal["auto"]``: a string), it is one of
    the literal's values."""
    if not type_ok(value, allowed_types(hint)):
        return False
    literals = literal_values(hint)
    if literals is None or value in literals:
        return True
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    others = tuple(t for o in (typing.get_args(hint) if union else (hint,))
                   if typing.get_origin(o) is not typing.Literal
                   for t in allowed_types(o))
    return type_ok(value, others)


def type_ok(value: Any, allowed: tuple) -> bool:
    if isinstance(value, bool) and bool not in allowed:
        return False
    return isinstance(value, allowed)


def expected_type(hint) -> str:
    literals = literal_values(hint)
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    others = [o for o in (typing.get_args(hint) if union else (hint,))
              if typing.get_origin(o) is not typing.Literal]
    if literals is not None:
        return " or ".join([expected_type(o) for o in others] + [repr(v) for v in literals])
    allowed = allowed_types(hint)
    return " or ".join("null" if t is type(None) else t.__name__
                       for t in allowed if t is not int or float not in allowed)


def describe_value(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_fields(obj) -> None:
    """Raise ContractError for the first field of dataclass ``obj`` of the wrong type."""
    for field in dataclasses.fields(obj):
        hint = hints_of(type(obj))[field.name]
        value = getattr(obj, field.name)
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, hint):
                raise ContractError(f"{field.name}: expected {hint.__name__}, "
                                    f"got {describe_value(value)}")
            continue
        if not admits(hint, value):
            raise ContractError(f"{field.name}: expected {expected_type(hint)}, "
                                f"got {describe_value(value)}")
