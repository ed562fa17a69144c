"""Frozen dataclasses as JSON text and back, derived from their fields' type hints: a dataclass that
gains a field travels with it, with no dict written by hand to keep in step.

What the fields may hold: str, int, float, bool, ``Literal`` values, ``torch.dtype`` (as ``str(dtype)``),
tuples (``tuple[int, ...]`` or ``tuple[float, bool]``), other such dataclasses, and ``Optional`` of any of
these. The kernel contract (``contract.KernelContract``) crosses the torch operators' schema this way
(``kernels.ops``: a string is a constant of a compiled graph).
"""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def to_json(obj: Any) -> str:
    """``obj`` (a dataclass instance) as JSON text, keys sorted: equal objects give equal text."""
    return json.dumps(dataclasses.asdict(obj), sort_keys=True, default=_leaf)


def from_json(cls: type[T], text: str) -> T:
    """The ``cls`` instance that ``to_json`` wrote."""
    return from_dict(cls, json.loads(text))


def from_dict(cls: type[T], fields: dict[str, Any]) -> T:
    """``cls`` from JSON's values of its fields (lists back to tuples, nested dicts to dataclasses)."""
    hints = typing.get_type_hints(cls)
    names = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(fields) - set(names))
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}; its fields: {names}")
    return cls(**{name: _decode(hints[name], value) for name, value in fields.items()})


def _leaf(value: Any) -> str:
    """JSON's form of a field value it has none for (``json.dumps``'s ``default``)."""
    if isinstance(value, torch.dtype):
        return str(value)
    raise TypeError(f"a {type(value).__name__} field ({value!r}) has no JSON form here; "
                    f"allowed: str, int, float, bool, torch.dtype, tuples and dataclasses of them")


def _decode(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [arg for arg in args if arg is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"{hint}: only Optional[X] unions have a JSON form here")
        return _decode(inner[0], value)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], item) for item in value)
        return tuple(_decode(arg, item) for arg, item in zip(args, value, strict=True))
    if hint is torch.dtype:
        dtype = getattr(torch, value.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{value!r} is not a torch dtype")
        return dtype
    if hint is float:
        return float(value)
    return value
