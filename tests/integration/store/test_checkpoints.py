"""Incremental checkpoints (§6): what a commit writes, how a state is rebuilt, and what a corrupt row does."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from sqlalchemy import func, select, update

from candor.harness.state import CapabilityState, HarnessState
from candor.service.errors import CheckpointCorrupt
from candor.service.store.checkpoints.incremental import (
    CheckpointEnvelope,
    EncodedMessage,
    LoadedCheckpoint,
    common_prefix_length,
    encode_envelope,
    encode_history,
    encode_message,
    envelope_for_state,
    import_history,
    insert_checkpoint,
    kept_count,
    load_state,
    plan_ranges,
    sha256_hex,
)
from candor.service.store.checkpoints.packed_messages import pack_messages, unpack_messages
from candor.service.store.db.engine import read_transaction, write_transaction
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import checkpoint_messages, checkpoints, runs

from .rows import add_run, add_thread, add_workspace

T0 = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)


def step(i: int) -> list[ModelMessage]:
    """Two messages of equal size for every `i` below 10**6: a tool call and its return."""
    call_id = f"call_{i:06d}"
    return [
        ModelResponse(
            parts=[ToolCallPart("lookup", {"z": f"{i:06d}", "a": 1}, call_id)], model_name="test", timestamp=T0
        ),
        ModelRequest(parts=[ToolReturnPart("lookup", f"result {i:06d}", call_id, timestamp=T0)], timestamp=T0),
    ]


def prompt(text: str) -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(text, timestamp=T0)], timestamp=T0)


def rich_state(thread_id: str) -> HarnessState:
    """A state with dicts whose keys are deliberately not sorted, anywhere they can occur."""
    history = [
        prompt("héllo ✓"),
        ModelResponse(
            parts=[
                ThinkingPart("hmm"),
                TextPart("calling"),
                ToolCallPart("t", {"b": [1, 2.5], "a": {"y": 1, "x": None}}),
            ],
            model_name="m",
            timestamp=T0,
            provider_details={"z": 1, "a": 2},
        ),
        ModelRequest(parts=[ToolReturnPart("t", {"k2": "v", "k1": [True]}, "c1", timestamp=T0)], timestamp=T0),
    ]
    return HarnessState(
        schema_version="1",
        thread_id=thread_id,
        message_history=tuple(history),
        capabilities={
            "zeta": CapabilityState(version="2", data={"b": 1, "a": [1, {"d": 0, "c": 1}]}),
            "alpha": CapabilityState(version="1", data=None),
        },
        environment={"workspace": {"path": "/w", "mode": "rw"}, "aaa": 1},
    )


async def _thread_and_run(db: Any) -> tuple[str, str, str]:
    async with write_transaction(db.engine) as conn:
        workspace_id = await add_workspace(conn)
        thread_id = await add_thread(conn, workspace_id)
        run_id = await add_run(conn, workspace_id, thread_id)
    return workspace_id, thread_id, run_id


async def _commit(
    db: Any,
    thread_id: str,
    run_id: str,
    seq: int,
    base: LoadedCheckpoint | None,
    state: HarnessState,
    base_id: str | None = None,
) -> Any:
    async with write_transaction(db.engine) as conn:
        return await insert_checkpoint(
            conn,
            thread_id=thread_id,
            run_id=run_id,
            seq=seq,
            attempt=1,
            base_id=base.id if base else base_id,
            base_encoded=base.encoded if base else (),
            new_encoded=encode_history(state._history_ref()),
            envelope=envelope_for_state(state),
        )


async def _load(db: Any, checkpoint_id: str) -> LoadedCheckpoint:
    async with read_transaction(db.engine) as conn:
        return await load_state(conn, checkpoint_id)


async def _row_count(db: Any, checkpoint_id: str) -> int:
    """How many messages the checkpoint stores itself (packed in its row; no `checkpoint_messages` rows)."""
    async with read_transaction(db.engine) as conn:
        legacy = select(func.count()).where(checkpoint_messages.c.checkpoint_id == checkpoint_id)
        assert (await conn.execute(legacy)).scalar_one() == 0
        c = checkpoints.c
        row = (await conn.execute(select(c.messages, c.kept, c.count).where(c.id == checkpoint_id))).one()
    unpacked = unpack_messages(
        row.messages, checkpoint_id=checkpoint_id, first_index=row.kept, count=row.count - row.kept
    )
    return len(unpacked)


@pytest.mark.parametrize(
    ("base", "new", "expected"),
    [
        ((), (), 0),
        (("a",), (), 0),
        ((), ("a",), 0),
        (("a", "b"), ("a", "b", "c"), 2),
        (("a", "b", "c"), ("a", "x", "c"), 1),
        (("a", "b"), ("a", "b"), 2),
        (("x",), ("a", "b"), 0),
    ],
)
def test_common_prefix_length(base: tuple[str, ...], new: tuple[str, ...], expected: int) -> None:
    """§6: `kept` is the longest common prefix by canonical message JSON (here: its digest)."""
    assert common_prefix_length(base, new) == expected


_BODIES = st.sampled_from(['{"a":1}', '{"b":2}', '{"c":3}'])


@given(
    base=st.lists(_BODIES, max_size=8),
    shared=st.integers(min_value=0, max_value=8),
    copied=st.booleans(),
    tail=st.lists(_BODIES, max_size=4),
)
def test_kept_count_is_the_common_prefix_of_the_digests(
    base: list[str], shared: int, copied: bool, tail: list[str]
) -> None:
    """§6, S-41: `kept_count` (the commit's fast path: the same message objects, compared at once) always equals
    the longest common prefix of the digests, whether the new history reuses the base's objects, holds equal
    copies of them, or differs anywhere."""
    base_encoded = [encode_message_body(body) for body in base]
    head = base_encoded[:shared]
    if copied:
        head = [encode_message_body(m.body) for m in head]
    new_encoded = [*head, *(encode_message_body(body) for body in tail)]
    digests = common_prefix_length([m.digest for m in base_encoded], [m.digest for m in new_encoded])
    assert kept_count(base_encoded, new_encoded) == digests


def encode_message_body(body: str) -> EncodedMessage:
    return EncodedMessage(body=body, digest=sha256_hex(body))


@pytest.mark.parametrize(
    ("chain", "expected"),
    [
        ([("c", None, 0, 3)], [("c", 0, 3)]),
        ([("c2", "c1", 3, 5), ("c1", None, 0, 3)], [("c2", 3, 5), ("c1", 0, 3)]),
        ([("c3", "c2", 2, 4), ("c2", "c1", 3, 5), ("c1", None, 0, 3)], [("c3", 2, 4), ("c1", 0, 2)]),
        ([("c2", "c1", 3, 3), ("c1", None, 0, 3)], [("c1", 0, 3)]),
        ([("c", None, 0, 0)], []),
    ],
)
def test_plan_ranges(chain: list[Any], expected: list[Any]) -> None:
    """§6 rebuild: only rows that survive into the checkpoint's history are read."""
    assert plan_ranges(chain) == expected


@pytest.mark.parametrize(
    "chain",
    [
        [],
        [("c2", "c1", 3, 5)],
        [("c1", None, 2, 3)],
        [("c2", "c1", 4, 5), ("c1", None, 0, 3)],
        [("c2", "c1", 1, 2), ("cX", None, 0, 3)],
    ],
)
def test_plan_ranges_refuses_broken_chains(chain: list[Any]) -> None:
    """S-46: a missing base, a kept beyond the base or a wrong link is corruption."""
    with pytest.raises(CheckpointCorrupt):
        plan_ranges(chain)


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=40), st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=4))
def test_message_encoding_is_stable(text: str, args: dict[str, Any]) -> None:
    """S-43: encoding is deterministic and decoding then re-encoding gives the same bytes and digest."""
    message = ModelResponse(parts=[TextPart(text), ToolCallPart("t", args, "c")], timestamp=T0)
    first, again = encode_message(message), encode_message(message)
    assert first == again and first.body.isascii()
    state_json = HarnessState(schema_version="1", thread_id="thr_x", message_history=(message,))
    decoded = ModelMessagesTypeAdapter.validate_json(f"[{first.body}]")
    assert encode_message(decoded[0]) == first
    assert HarnessState(schema_version="1", thread_id="thr_x", message_history=tuple(decoded)).model_dump_json() == (
        state_json.model_dump_json()
    )


def test_envelope_digest_is_over_canonical_json() -> None:
    """§6: the envelope digest is the SHA-256 of its canonical JSON, whatever order the stored text keeps."""
    envelope = CheckpointEnvelope(thread_id="thr_x", environment={"b": 1, "a": 2})
    encoded = encode_envelope(envelope)
    assert encoded.text.index('"b"') < encoded.text.index('"a"')
    reordered = encode_envelope(CheckpointEnvelope(thread_id="thr_x", environment={"a": 2, "b": 1}))
    assert reordered.digest == encoded.digest and reordered.text != encoded.text


async def test_round_trip_is_byte_identical(db: Any) -> None:
    """S-43: the state rebuilt from a checkpoint dumps exactly like the state that was committed."""
    _, thread_id, run_id = await _thread_and_run(db)
    state = rich_state(thread_id)
    written = await _commit(db, thread_id, run_id, 1, None, state)
    loaded = await _load(db, written.id)
    assert loaded.state.model_dump_json() == state.model_dump_json()
    assert loaded.seq == 1 and loaded.format == 1
    assert loaded.encoded == encode_history(state._history_ref())
    assert loaded.deferred_json is None and loaded.resume_input_consumed is False


async def test_commit_writes_only_new_messages(db: Any) -> None:
    """S-41, S-40: kept = base count for append-only growth; count − kept rows are inserted, old rows untouched."""
    _, thread_id, run_id = await _thread_and_run(db)
    history = [prompt("go"), *step(1)]
    first = await _commit(
        db,
        thread_id,
        run_id,
        1,
        None,
        HarnessState(schema_version="1", thread_id=thread_id, message_history=tuple(history)),
    )
    assert (first.kept, first.count, await _row_count(db, first.id)) == (0, 3, 3)
    base = await _load(db, first.id)
    packed = select(checkpoints.c.messages).where(checkpoints.c.id == first.id)
    async with read_transaction(db.engine) as conn:
        before = (await conn.execute(packed)).scalar_one()
    grown = HarnessState(schema_version="1", thread_id=thread_id, message_history=tuple(history + step(2)))
    second = await _commit(db, thread_id, run_id, 2, base, grown)
    assert (second.kept, second.count, await _row_count(db, second.id)) == (3, 5, 2)
    async with read_transaction(db.engine) as conn:
        assert (await conn.execute(packed)).scalar_one() == before
    assert (await _load(db, second.id)).state.model_dump_json() == grown.model_dump_json()


async def test_diverged_history_writes_from_first_difference(db: Any) -> None:
    """S-41: after a history rewrite, rows are written from the first differing message; the rebuild is exact."""
    _, thread_id, run_id = await _thread_and_run(db)
    original = [prompt("go"), *step(1), *step(2)]
    first = await _commit(
        db,
        thread_id,
        run_id,
        1,
        None,
        HarnessState(schema_version="1", thread_id=thread_id, message_history=tuple(original)),
    )
    base = await _load(db, first.id)
    rewritten = [prompt("go"), *step(1), prompt("changed"), *step(3), *step(4)]
    state = HarnessState(schema_version="1", thread_id=thread_id, message_history=tuple(rewritten))
    second = await _commit(db, thread_id, run_id, 2, base, state)
    assert (second.kept, second.count, await _row_count(db, second.id)) == (3, 8, 5)
    shrunk = HarnessState(schema_version="1", thread_id=thread_id, message_history=tuple(rewritten[:2]))
    third = await _commit(db, thread_id, run_id, 3, await _load(db, second.id), shrunk)
    assert (third.kept, third.count, await _row_count(db, third.id)) == (2, 2, 0)
    assert (await _load(db, second.id)).state.model_dump_json() == state.model_dump_json()
    assert (await _load(db, third.id)).state.model_dump_json() == shrunk.model_dump_json()


async def test_bytes_per_commit_do_not_grow_with_history(db: Any) -> None:
    """S-42: for equal-size steps, the 200th commit writes within 10 % of the bytes of the 2nd."""
    _, thread_id, run_id = await _thread_and_run(db)
    history: list[ModelMessage] = []
    base: Any = None
    written = []
    for seq in range(1, 201):
        history += step(seq)
        state = HarnessState(schema_version="1", thread_id=thread_id, message_history=tuple(history))
        new_encoded = (base.encoded if base else []) + encode_history(step(seq))  # the worker's in-memory form
        async with write_transaction(db.engine) as conn:
            result = await insert_checkpoint(
                conn,
                thread_id=thread_id,
                run_id=run_id,
                seq=seq,
                attempt=1,
                base_id=base.id if base else None,
                base_encoded=base.encoded if base else [],
                new_encoded=new_encoded,
                envelope=envelope_for_state(state),
            )
        written.append(result)
        base = LoadedCheckpoint(
            id=result.id,
            seq=seq,
            format=1,
            state=state,
            encoded=new_encoded,
            deferred_json=None,
            resume_input_consumed=False,
        )
    assert all(w.count - w.kept == 2 for w in written)
    assert abs(written[199].bytes_written - written[1].bytes_written) <= 0.1 * written[1].bytes_written
    loaded = await _load(db, written[-1].id)
    assert loaded.state.model_dump_json() == state.model_dump_json()
    assert loaded.encoded == new_encoded


async def test_successor_extends_predecessor_checkpoint(db: Any) -> None:
    """S-44: a later run's first commit (and a fork's) uses the predecessor's checkpoint as base, copying nothing."""
    workspace_id, thread_id, run_id = await _thread_and_run(db)
    history = [prompt("go"), *step(1)]
    first = await _commit(
        db,
        thread_id,
        run_id,
        1,
        None,
        HarnessState(schema_version="1", thread_id=thread_id, message_history=tuple(history)),
    )
    start = await _load(db, first.id)
    async with write_transaction(db.engine) as conn:  # seal the predecessor, then accept its successor (S-1)
        await conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(status="cancelled", sealed_at=db_now(), failure={"code": "cancelled", "message": "x"})
        )
        successor = await add_run(
            conn,
            workspace_id,
            thread_id,
            parent_run_id=run_id,
            trigger="queued",
            lineage="continue",
            start_checkpoint_id=first.id,
        )
    grown = HarnessState(schema_version="1", thread_id=thread_id, message_history=tuple(history + step(2)))
    written = await _commit(db, thread_id, successor, 1, start, grown)
    assert (written.kept, written.count, await _row_count(db, written.id)) == (3, 5, 2)
    async with read_transaction(db.engine) as conn:
        base_id = (await conn.execute(select(checkpoints.c.base_id).where(checkpoints.c.id == written.id))).scalar()
    assert base_id == first.id
    forked = start.state.fork()
    async with write_transaction(db.engine) as conn:
        fork_thread = await add_thread(conn, workspace_id, id=forked.thread_id, origin="fork")
        fork_run = await add_run(conn, workspace_id, fork_thread, lineage="fork")
    fork_written = await _commit(db, fork_thread, fork_run, 1, start, forked)
    assert (fork_written.kept, fork_written.count, await _row_count(db, fork_written.id)) == (3, 3, 0)
    loaded = await _load(db, fork_written.id)
    assert loaded.state.model_dump_json() == forked.model_dump_json()
    assert loaded.state.thread_id == forked.thread_id and loaded.state.environment == {}


async def test_imported_history_is_checkpoint_zero(db: Any) -> None:
    """S-45: `message_history` of a new thread is stored once, as seq 0 without a run; the first run extends it."""
    _workspace_id, thread_id, run_id = await _thread_and_run(db)
    history = [prompt("imported"), *step(1)]
    async with write_transaction(db.engine) as conn:
        imported = await import_history(conn, thread_id, history)
        row = (await conn.execute(select(checkpoints).where(checkpoints.c.id == imported.id))).one()
    count = row._mapping["count"]  # `row.count` is also tuple's method, to a type checker
    assert (row.seq, row.run_id, row.attempt, row.base_id, row.kept, count) == (0, None, None, None, 0, 3)
    start = await _load(db, imported.id)
    expected = HarnessState(schema_version="1", thread_id=thread_id, message_history=tuple(history))
    assert start.state.model_dump_json() == expected.model_dump_json()
    grown = HarnessState(schema_version="1", thread_id=thread_id, message_history=tuple(history + step(2)))
    written = await _commit(db, thread_id, run_id, 1, start, grown)
    assert (written.kept, await _row_count(db, written.id)) == (3, 2)


async def test_tampered_rows_are_detected(db: Any) -> None:
    """S-46 (store part): a packed body or an envelope that no longer matches its digest, or a packed value that
    lost a message, raises CheckpointCorrupt."""
    _, thread_id, run_id = await _thread_and_run(db)
    state = HarnessState(schema_version="1", thread_id=thread_id, message_history=(prompt("a"), *step(1)))
    first = await _commit(db, thread_id, run_id, 1, None, state)
    second = await _commit(
        db,
        thread_id,
        run_id,
        2,
        await _load(db, first.id),
        HarnessState(schema_version="1", thread_id=thread_id, message_history=(*state._history_ref(), *step(2))),
    )
    packed = select(checkpoints.c.messages).where(checkpoints.c.id == first.id)
    async with write_transaction(db.engine) as conn:  # a body changed behind its digest, its length kept
        original = (await conn.execute(packed)).scalar_one()
        tampered = original.replace("000001", "000009")
        assert tampered != original
        await conn.execute(update(checkpoints).where(checkpoints.c.id == first.id).values(messages=tampered))
    with pytest.raises(CheckpointCorrupt) as caught:
        await _load(db, second.id)  # the corrupt row sits in the base
    assert caught.value.code == "checkpoint_corrupt"
    third = await _commit(db, thread_id, run_id, 3, None, state)
    async with write_transaction(db.engine) as conn:
        envelope = (await conn.execute(select(checkpoints.c.envelope).where(checkpoints.c.id == third.id))).scalar()
        assert envelope is not None
        await conn.execute(
            update(checkpoints)
            .where(checkpoints.c.id == third.id)
            .values(envelope=envelope.replace(thread_id, "thr_other"))
        )
    with pytest.raises(CheckpointCorrupt):
        await _load(db, third.id)
    async with write_transaction(db.engine) as conn:  # the base repaired, the leaf's last message cut off
        await conn.execute(update(checkpoints).where(checkpoints.c.id == first.id).values(messages=original))
        leaf = (await conn.execute(select(checkpoints.c.messages).where(checkpoints.c.id == second.id))).scalar_one()
        records = unpack_messages(leaf, checkpoint_id=second.id, first_index=3, count=2)
        cut = pack_messages([EncodedMessage(body=body, digest=digest) for body, digest in records[:-1]])
        await conn.execute(update(checkpoints).where(checkpoints.c.id == second.id).values(messages=cut))
    with pytest.raises(CheckpointCorrupt):  # missing messages
        await _load(db, second.id)
    with pytest.raises(CheckpointCorrupt):
        await _load(db, "ckp_missing")


def test_encoding_is_reused_only_for_the_same_message_objects() -> None:
    """§6, S-42: a boundary re-encodes only messages it has not encoded before; a replaced message (a rewrite)
    is encoded again from there on; the result always equals a full encoding."""
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

    from candor.service.store.checkpoints import incremental as store_checkpoints
    from candor.service.store.checkpoints.incremental import encode_history, encode_history_reusing

    first = [ModelRequest(parts=[UserPromptPart(f"q{i}")]) for i in range(3)]
    encoded = encode_history(first)
    grown: list[ModelMessage] = [*first, ModelResponse(parts=[TextPart("a")])]
    calls: list[int] = []
    real = store_checkpoints.encode_history

    def counting(messages: Any) -> Any:
        calls.append(len(messages))
        return real(messages)

    store_checkpoints.encode_history = counting
    try:
        assert encode_history_reusing(grown, first, encoded) == encode_history(grown)
        assert calls == [1]  # only the new message was encoded
        rewritten = [first[0], ModelRequest(parts=[UserPromptPart("changed")]), *grown[2:]]
        calls.clear()
        assert encode_history_reusing(rewritten, first, encoded) == real(rewritten)
        assert calls == [3]  # from the first replaced message on
    finally:
        store_checkpoints.encode_history = real
