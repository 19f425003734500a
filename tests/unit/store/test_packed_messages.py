"""The new messages of a checkpoint packed into its row (§6 amended, issue 33): the form round-trips, and every way
a stored value can be wrong is `CheckpointCorrupt` (S-46)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from candor.service.errors import CheckpointCorrupt
from candor.service.store.checkpoints.incremental import EncodedMessage, sha256_hex
from candor.service.store.checkpoints.packed_messages import pack_messages, unpack_messages


def _message(body: str) -> EncodedMessage:
    return EncodedMessage(body=body, digest=sha256_hex(body))


MESSAGES = [_message('{"kind":"request","parts":[]}'), _message(""), _message('{"a":"1:2","b":"x"}')]
FIRST_HEADER = f"{MESSAGES[0].digest}{len(MESSAGES[0].body)}:"


def test_packed_messages_round_trip() -> None:
    """S-41, S-43: each message is its digest, its length and its body, in order; bodies containing ':' and empty
    bodies come back unchanged, and no messages pack to an empty value."""
    packed = pack_messages(MESSAGES)
    assert packed.startswith(FIRST_HEADER + MESSAGES[0].body)
    assert unpack_messages(packed, checkpoint_id="ckp", first_index=4, count=3) == [
        (m.body, m.digest) for m in MESSAGES
    ]
    assert pack_messages([]) == "" and unpack_messages("", checkpoint_id="ckp", first_index=0, count=0) == []


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda packed: packed.replace('"x"', '"y"'), "message 6 of checkpoint ckp fails its digest"),
        (lambda packed: packed[:-5], "truncated"),
        (lambda packed: packed[:10], "malformed"),
        (lambda packed: packed.replace(FIRST_HEADER, FIRST_HEADER[:-2] + "x:"), "malformed"),
        (lambda packed: packed + pack_messages([_message("{}")]), "holds 4 message(s), expected 3"),
    ],
    ids=["body changed", "cut short", "cut in a digest", "bad length", "one too many"],
)
def test_a_damaged_packed_value_is_corrupt(damage: Callable[[str], str], message: str) -> None:
    """S-46: a body that no longer matches its digest, a value cut short or with a bad length, and a value holding
    another number of messages than the checkpoint's `count − kept` are all `CheckpointCorrupt`."""
    packed = damage(pack_messages(MESSAGES))
    with pytest.raises(CheckpointCorrupt) as caught:
        unpack_messages(packed, checkpoint_id="ckp", first_index=4, count=3)
    assert message in str(caught.value)


def test_only_the_requested_messages_are_checked() -> None:
    """S-46: a reader checks the digests of the messages it returns (`verify`), so a page before a damaged message
    is still served; the damaged one is not."""
    packed = pack_messages(MESSAGES).replace('"x"', '"y"')  # message 6 (the third) damaged
    records = unpack_messages(packed, checkpoint_id="ckp", first_index=4, count=3, verify=(4, 6))
    assert records[:2] == [(m.body, m.digest) for m in MESSAGES[:2]]
    with pytest.raises(CheckpointCorrupt):
        unpack_messages(packed, checkpoint_id="ckp", first_index=4, count=3, verify=(5, 7))
