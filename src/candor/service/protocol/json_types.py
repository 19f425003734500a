"""(pure) The types protocol functions take and return instead of `Any` (mypy forbids explicit `Any` here).

`JsonValue` is pydantic's recursive JSON type; `JsonObject` a JSON object as stored in a JSON column; `RowLike` a
row read by column name. Functions that check untrusted input take `object` and narrow it themselves.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import JsonValue

__all__ = ("JsonValue", "JsonObject", "RowLike")

JsonObject = dict[str, JsonValue]


class RowLike(Protocol):
    """A row read by column name: a mapping, or a SQLAlchemy `RowMapping` (whose keys may also be columns)."""

    def __getitem__(self, key: str, /) -> object: ...
