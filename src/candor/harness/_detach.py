"""Detached copies of pydantic-ai messages: what `copy.deepcopy` returns, at a fraction of its cost (H-6, H-11).

The harness copies every message that enters a run's canonical history (pydantic-ai and tools keep references to
the originals) and every history it hands out. Messages are plain dataclasses holding JSON containers and immutable
leaves, and `copy.deepcopy` spends most of its time on generic machinery (`__reduce_ex__`, the copy registry) for
them. `detached()` walks exactly those shapes itself: it copies lists, dicts and plain dataclass objects, shares
immutable leaves, keeps aliasing (an object reached twice is copied once) and hands anything else to
`copy.deepcopy` with the same memo, so the result is always a deep copy.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

__all__ = ("detached", "detached_all")

T = TypeVar("T")

_IMMUTABLE_LEAVES: frozenset[type] = frozenset(
    {str, int, float, bool, type(None), bytes, complex, datetime, date, timedelta, Decimal}
)
"""Exact types shared instead of copied (subclasses could add mutable state, so they go the long way)."""

_PLAIN: dict[type, bool] = {}
"""Per class: whether it is a dataclass whose instances are fully described by their `__dict__`."""


def _is_plain_dataclass(cls: type) -> bool:
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = (
            dataclasses.is_dataclass(cls)
            and not any(klass.__dict__.get("__slots__") for klass in cls.__mro__)
            and cls.__reduce_ex__ is object.__reduce_ex__
            and cls.__reduce__ is object.__reduce__
            and getattr(cls, "__getstate__", object.__getstate__) is object.__getstate__
            and not hasattr(cls, "__setstate__")
            and not hasattr(cls, "__deepcopy__")
        )
        _PLAIN[cls] = plain
    return plain


def _copy(value: Any, memo: dict[int, Any]) -> Any:
    cls = type(value)
    if cls in _IMMUTABLE_LEAVES:
        return value
    key = id(value)
    if key in memo:
        return memo[key]
    if cls is list:
        items: list[Any] = []
        memo[key] = items
        items.extend([_copy(item, memo) for item in value])
        return items
    if cls is tuple:
        copied = tuple([_copy(item, memo) for item in value])  # messages hold no reference cycles through tuples
        memo[key] = copied
        return copied
    if cls is dict:
        mapping: dict[Any, Any] = {}
        memo[key] = mapping
        for name, item in value.items():
            mapping[name] = _copy(item, memo)
        return mapping
    if _is_plain_dataclass(cls):
        new = object.__new__(cls)
        memo[key] = new
        fields = new.__dict__
        for name, item in value.__dict__.items():
            fields[name] = _copy(item, memo)
        return new
    return copy.deepcopy(value, memo)


def detached(value: T) -> T:
    """A deep copy of `value` (a message, a part, a JSON value) sharing no mutable object with it."""
    return _copy(value, {})  # type: ignore[no-any-return]


def detached_all(values: Iterable[T]) -> list[T]:
    """Deep copies of `values` with one memo, so an object shared between them stays shared between the copies."""
    memo: dict[int, Any] = {}
    return [_copy(value, memo) for value in values]
