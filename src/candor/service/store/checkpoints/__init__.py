"""Incremental checkpoints (spec §6): encoding, packed message rows, rebuilding and verifying state.

This is the face code outside `store/` imports; modules inside `store/` import each other directly.
"""

from __future__ import annotations

from .incremental import (
    EncodedEnvelope,
    EncodedMessage,
    build_message_schemas,
    canonical_json,
    encode_envelope,
    encode_history_reusing,
    envelope_for_state,
    import_history,
    load_envelope,
)

__all__ = (
    "EncodedEnvelope",
    "EncodedMessage",
    "build_message_schemas",
    "canonical_json",
    "encode_envelope",
    "encode_history_reusing",
    "envelope_for_state",
    "import_history",
    "load_envelope",
)
