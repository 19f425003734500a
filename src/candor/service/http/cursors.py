"""List cursors (§8.1, S-98): opaque tokens bound to the collection, the caller's scope and the list's filters.

A cursor is url-safe base64 of a small JSON object: the collection name, a digest of the scope (workspace and
parent id) and of the filters, and the keyset position of the last item returned. The digests keep ids and
filter values out of the token. `read_cursor` answers `InvalidCursor` (400 `invalid_cursor`) for a token that is
malformed or was issued for another collection, scope or filters. Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from ..protocol.idempotency import canonical_json, sha256_hex
from .errors import InvalidCursor

__all__ = ("issue_cursor", "read_cursor", "keyset", "index_keyset")

_VERSION = 1


def _binding(scope: Mapping[str, str], filters: Mapping[str, Any]) -> tuple[str, str]:
    return sha256_hex(canonical_json(dict(scope)))[:32], sha256_hex(canonical_json(dict(filters)))[:32]


def issue_cursor(collection: str, *, scope: Mapping[str, str], filters: Mapping[str, Any], position: list[Any]) -> str:
    """The cursor that continues `collection` (under `scope` and `filters`) after `position`."""
    scope_digest, filters_digest = _binding(scope, filters)
    token = {"v": _VERSION, "c": collection, "s": scope_digest, "f": filters_digest, "p": position}
    return base64.urlsafe_b64encode(canonical_json(token).encode("utf-8")).rstrip(b"=").decode("ascii")


def read_cursor(cursor: str, collection: str, *, scope: Mapping[str, str], filters: Mapping[str, Any]) -> list[Any]:
    """The keyset position inside `cursor`; `InvalidCursor` unless it was issued for exactly this list."""
    try:
        raw = base64.urlsafe_b64decode(cursor.encode("ascii") + b"=" * (-len(cursor) % 4))
        token = json.loads(raw.decode("utf-8"))
    except (binascii.Error, UnicodeError, ValueError) as exc:
        raise InvalidCursor() from exc
    scope_digest, filters_digest = _binding(scope, filters)
    expected = {"v": _VERSION, "c": collection, "s": scope_digest, "f": filters_digest}
    if not isinstance(token, dict) or set(token) != {*expected, "p"} or not isinstance(token["p"], list):
        raise InvalidCursor()
    if any(token[name] != value for name, value in expected.items()):
        raise InvalidCursor()
    return token["p"]


def keyset(position: list[Any]) -> tuple[float, str]:
    """A `(created_at, id)` keyset position; `InvalidCursor` for any other shape."""
    match position:
        case [int() | float() as created_at, str() as item_id] if not isinstance(created_at, bool):
            return float(created_at), item_id
    raise InvalidCursor()


def index_keyset(position: list[Any]) -> int:
    """A `[index]` keyset position (an entry position, a message offset) of at least 0; `InvalidCursor` otherwise."""
    match position:
        case [int() as index] if not isinstance(index, bool) and index >= 0:
            return index
    raise InvalidCursor()
