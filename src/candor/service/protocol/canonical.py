"""Canonical JSON and SHA-256 hex digests: the one implementation behind every request digest, options digest,
checkpoint digest, size check, lease-token and key-secret hash, and webhook body of the service.

Canonical JSON is sorted keys, no insignificant whitespace and finite numbers only (NaN and infinities raise
`ValueError`, values that are not JSON `TypeError`). Text is kept as UTF-8 by default; `ascii_only=True` escapes
everything outside ASCII, the form checkpoint envelope digests have been stored in since the first schema (§5.1),
so it must not change for them.
"""

from __future__ import annotations

import hashlib
import json

__all__ = ("canonical_json", "sha256_hex")


def canonical_json(value: object, *, ascii_only: bool = False) -> str:
    """The canonical JSON text of `value` (sorted keys, compact separators, finite numbers only)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=ascii_only, allow_nan=False)


def sha256_hex(data: str | bytes) -> str:
    """The SHA-256 hex digest of `data` (a text is hashed as its UTF-8 bytes)."""
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()
