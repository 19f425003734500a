"""The new messages of a checkpoint packed into its own row (§6, amended): `checkpoints.messages`.

A checkpoint stores only the messages `kept ≤ index < count` it adds (S-41), as one text value, so a plain step is
one INSERT. The form is one record per message, in index order:

    <digest: 64 lowercase hex characters><length: decimal characters of the body>:<body>

Bodies are ASCII JSON (`checkpoints.encode_message`): lengths in characters are bytes and nothing is escaped.
Reading a range of history reads only the checkpoints holding it (`plan_ranges`); every body is checked against
its digest (S-46).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ...errors import CheckpointCorrupt
from ...protocol.canonical import sha256_hex

__all__ = ("pack_messages", "unpack_messages")

_DIGEST_LENGTH = 64


class _Message(Protocol):
    """A message in stored form (`checkpoints.EncodedMessage`)."""

    @property
    def body(self) -> str: ...
    @property
    def digest(self) -> str: ...


def pack_messages(messages: Sequence[_Message]) -> str:
    """The packed form of `messages` (pure)."""
    return "".join(f"{message.digest}{len(message.body)}:{message.body}" for message in messages)


def unpack_messages(
    packed: str, *, checkpoint_id: str, first_index: int, count: int, verify: tuple[int, int] | None = None
) -> list[tuple[str, str]]:
    """The `count` messages `(body, digest)` of a packed value, by history index from `first_index` (the
    checkpoint's `kept`); raises `CheckpointCorrupt` on a digest mismatch, a malformed record, or a record count
    other than `count` (pure). Every record is parsed; digests are checked for the indexes `[low, high)` of
    `verify`, or for all of them: a reader checks what it returns, so a page before a damaged message is still
    served, as with one row per message."""
    low, high = verify if verify is not None else (first_index, first_index + count)
    messages: list[tuple[str, str]] = []
    position, end = 0, len(packed)
    while position < end:
        index = first_index + len(messages)
        digest = packed[position : position + _DIGEST_LENGTH]
        colon = packed.find(":", position + _DIGEST_LENGTH)
        length_text = packed[position + _DIGEST_LENGTH : colon] if colon >= 0 else ""
        if len(digest) != _DIGEST_LENGTH or not length_text.isascii() or not length_text.isdigit():
            raise CheckpointCorrupt(f"message {index} of checkpoint {checkpoint_id} is malformed")
        start = colon + 1
        stop = start + int(length_text)
        if stop > end:
            raise CheckpointCorrupt(f"message {index} of checkpoint {checkpoint_id} is truncated")
        body = packed[start:stop]
        if low <= index < high and sha256_hex(body) != digest:
            raise CheckpointCorrupt(f"message {index} of checkpoint {checkpoint_id} fails its digest")
        messages.append((body, digest))
        position = stop
    if len(messages) != count:
        raise CheckpointCorrupt(f"checkpoint {checkpoint_id} holds {len(messages)} message(s), expected {count}")
    return messages
