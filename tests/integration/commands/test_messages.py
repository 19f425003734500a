"""A run's messages (§8.3 `GET /v1/runs/{run_id}/messages`): the messages it added to the history it started from,
rebuilt from its latest checkpoint (§6), paged by index. S-43, S-46, S-126."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from sqlalchemy import select, update

from candor.service import commands
from candor.service.errors import CheckpointCorrupt, NotFound
from candor.service.store.checkpoints.incremental import EncodedMessage
from candor.service.store.checkpoints.packed_messages import pack_messages, unpack_messages
from candor.service.store.db.engine import read_transaction, write_transaction
from candor.service.store.reads.messages import iter_added_messages, window_ranges
from candor.service.store.schema.tables import checkpoints

from commands.helpers import TEXT, claim_run, commit_history, make_service, new_key
from transactions import statements_sent

_T = datetime(2025, 1, 1, tzinfo=UTC)


def _turn(n: int) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(content=f"question {n}", timestamp=_T)]),
        ModelResponse(parts=[TextPart(content=f"answer {n}")], timestamp=_T),
    ]


def _json(messages: list[ModelMessage], run_id: str) -> list[Any]:
    """The messages as the read answers them: each `run_id` is candor's run id (issue 14)."""
    return [message | {"run_id": run_id} for message in ModelMessagesTypeAdapter.dump_python(messages, mode="json")]


async def test_messages_the_run_added_from_its_latest_checkpoint(db: Any) -> None:
    """S-43: the messages after the start checkpoint's history, from the run's latest checkpoint, in pages."""
    service = make_service(db)
    key = await new_key(service)
    imported = _turn(0)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, message_history=imported, key="k")
    run = accepted.run
    assert run is not None and run.start_checkpoint_id is not None
    assert await commands.list_run_messages_page(service, key, run.id) == ([], False)  # not committed yet
    await claim_run(service, run.id)
    first = [*imported, *_turn(1)]
    first_id = await commit_history(service, run, first, base=(run.start_checkpoint_id, imported), seq=1)
    latest = [*first, *_turn(2), *_turn(3)]
    await commit_history(service, run, latest, base=(first_id, first), seq=2)
    added = _json(latest[2:], run.id)
    assert await commands.list_run_messages_page(service, key, run.id, limit=100) == (added, False)
    page, more = await commands.list_run_messages_page(service, key, run.id, limit=4)
    rest, last = await commands.list_run_messages_page(service, key, run.id, limit=4, offset=4)
    assert (page, more, rest, last) == (added[:4], True, added[4:], False)
    assert await commands.list_run_messages_page(service, key, run.id, offset=6) == ([], False)


async def test_all_added_messages_in_pages_read_the_checkpoint_chain_once(db: Any) -> None:
    """S-43, S-46: iterating a run's added messages page by page (the run view's recovered calls) yields them all in
    order, and reads the checkpoint chain once, not once per page: a thread's chain is as long as its checkpoints."""
    service = make_service(db)
    key = await new_key(service)
    imported = _turn(0)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, message_history=imported, key="k")
    run = accepted.run
    assert run is not None and run.start_checkpoint_id is not None
    await claim_run(service, run.id)
    history = list(imported)
    base: tuple[str, list[ModelMessage]] = (run.start_checkpoint_id, list(imported))
    for seq in range(1, 6):
        history = [*history, *_turn(seq)]
        base = (await commit_history(service, run, history, base=base, seq=seq), history)
    added = ModelMessagesTypeAdapter.dump_python(history[2:], mode="json")
    async with read_transaction(service.engine) as conn:
        with statements_sent(service.engine) as sent:
            pages = [
                page
                async for page in iter_added_messages(
                    conn, checkpoint_id=base[0], start_checkpoint_id=run.start_checkpoint_id, page_size=3
                )
            ]
    assert [len(page) for page in pages] == [3, 3, 3, 1]
    assert [message for page in pages for message in page] == added
    assert sum("RECURSIVE" in statement for statement in sent) == 1


async def test_a_run_without_a_start_checkpoint_added_its_whole_history(db: Any) -> None:
    """§6: a thread's first run without imported history starts from nothing, so every message is its own."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    assert accepted.run is not None
    await claim_run(service, accepted.run.id)
    await commit_history(service, accepted.run, _turn(1), base=None, seq=1)
    expected = _json(_turn(1), accepted.run.id)
    assert await commands.list_run_messages_page(service, key, accepted.run.id) == (expected, False)


async def test_a_tampered_message_row_is_corrupt(db: Any) -> None:
    """S-46: a body that fails its digest, or a missing message, is never served; pages before it still are."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    assert accepted.run is not None
    await claim_run(service, accepted.run.id)
    checkpoint_id = await commit_history(service, accepted.run, _turn(1), base=None, seq=1)
    packed = select(checkpoints.c.messages).where(checkpoints.c.id == checkpoint_id)
    async with write_transaction(service.engine) as conn:  # the second message's body changed behind its digest
        original = (await conn.execute(packed)).scalar_one()
        records = unpack_messages(original, checkpoint_id=checkpoint_id, first_index=0, count=2)
        tampered = [EncodedMessage(body=body, digest=digest) for body, digest in records]
        tampered[1] = EncodedMessage(body=tampered[1].body.replace("answer", "ANSWER"), digest=tampered[1].digest)
        await conn.execute(
            update(checkpoints).where(checkpoints.c.id == checkpoint_id).values(messages=pack_messages(tampered))
        )
    with pytest.raises(CheckpointCorrupt):
        await commands.list_run_messages_page(service, key, accepted.run.id)
    expected = _json(_turn(1), accepted.run.id)[:1]
    assert await commands.list_run_messages_page(service, key, accepted.run.id, limit=1) == (expected, True)
    async with write_transaction(service.engine) as conn:  # the second message missing
        missing = pack_messages([EncodedMessage(body=body, digest=digest) for body, digest in records[:1]])
        await conn.execute(update(checkpoints).where(checkpoints.c.id == checkpoint_id).values(messages=missing))
    with pytest.raises(CheckpointCorrupt):  # a missing message
        await commands.list_run_messages_page(service, key, accepted.run.id)


async def test_another_workspaces_run_is_not_found(db: Any) -> None:
    """S-126: a run of another workspace answers 404 like an unknown one."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    with pytest.raises(NotFound):
        assert accepted.run is not None
        await commands.list_run_messages_page(service, await new_key(service), accepted.run.id)


def test_window_ranges_cut_the_chain_ranges_to_the_page() -> None:
    """§6: only the rows of the requested indexes are read."""
    ranges = [("ckp_b", 4, 6), ("ckp_a", 0, 4)]
    assert window_ranges(ranges, 3, 5) == [("ckp_b", 4, 5), ("ckp_a", 3, 4)]
    assert window_ranges(ranges, 4, 6) == [("ckp_b", 4, 6)]
    assert window_ranges(ranges, 6, 8) == []
