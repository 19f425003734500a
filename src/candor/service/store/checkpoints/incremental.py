"""Incremental checkpoints (spec §6): encode, write only the new messages, rebuild and verify `HarnessState`.

A message is stored as its deterministic compact JSON with its SHA-256 digest (`encode_message`), the rest of the
state as an envelope with the digest of its canonical JSON (`encode_envelope`). The history of a checkpoint `c` is
`history(base(c))[:kept(c)] + rows(c)`; a commit writes only the messages past `kept`, packed into its own row
(`checkpoints.messages`, packed_messages.py; rows written before migration 0007 hold them as `checkpoint_messages`
rows, and both are read). `load_state()` reads the chain
with one recursive query and only the rows that survive, verifies every digest (`CheckpointCorrupt` on any
mismatch, gap or broken chain) and decodes all bodies in one pass.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.messages import BaseToolReturnPart, ModelMessage, ToolReturn
from sqlalchemy import Insert, Select, and_, bindparam, insert, literal, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from candor.harness.state import CapabilityState, HarnessState

from ...errors import CheckpointCorrupt
from ...protocol.canonical import canonical_json as shared_canonical_json
from ...protocol.canonical import sha256_hex
from ..schema.dialect import db_now
from ..schema.tables import CHECKPOINT_FORMAT, checkpoint_messages, checkpoints, threads
from .packed_messages import pack_messages, unpack_messages

__all__ = (
    "EncodedMessage",
    "EncodedEnvelope",
    "CheckpointEnvelope",
    "CheckpointWritten",
    "LoadedCheckpoint",
    "canonical_json",
    "sha256_hex",
    "build_message_schemas",
    "encode_message",
    "encode_history",
    "encode_envelope",
    "envelope_for_state",
    "common_prefix_length",
    "kept_count",
    "new_checkpoint_id",
    "checkpoint_writes",
    "insert_checkpoint",
    "import_history",
    "load_state",
    "insert_checkpoint_row",
    "written_bytes",
    "read_message_ranges",
    "select_checkpoint",
    "select_chain",
    "select_message_ranges",
    "plan_ranges",
)

_MAX_CHAIN = 1_000_000
_RANGES_PER_QUERY = 200


@dataclass(frozen=True, kw_only=True, slots=True)
class EncodedMessage:
    """One message in stored form."""

    body: str
    """Compact JSON of the message (see `encode_message`)."""
    digest: str
    """SHA-256 hex of `body`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EncodedEnvelope:
    """An envelope in stored form."""

    text: str
    """Compact, order-preserving JSON."""
    digest: str
    """SHA-256 hex of the canonical (sorted-key) JSON."""


class CheckpointEnvelope(BaseModel):
    """Everything of a checkpoint except its messages (§6)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: Literal["1"] = "1"
    thread_id: str
    capabilities: dict[str, CapabilityState] = Field(default_factory=dict)
    environment: dict[str, JsonValue] = Field(default_factory=dict)
    deferred: JsonValue = None
    """`DeferredToolRequests` JSON of a `waiting` outcome, else null."""
    resume_input_consumed: bool = False
    """Whether the resume `input` of a successor is already in the history (S-88)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointWritten:
    """What `insert_checkpoint()` wrote."""

    id: str
    kept: int
    """Messages taken from the base."""
    count: int
    """Messages in the checkpoint's history."""
    bytes_written: int
    """Message bodies and digests plus the envelope and its digest (`candor_checkpoint_commit_bytes`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadedCheckpoint:
    """A rebuilt checkpoint."""

    id: str
    seq: int
    format: int
    state: HarnessState
    encoded: list[EncodedMessage]
    """The history in stored form: the base for the worker's next commit."""
    deferred_json: JsonValue
    resume_input_consumed: bool


# --- pure encoding -----------------------------------------------------------------------------------------------


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, ASCII, finite numbers only (§5.1): the service's one canonical JSON in the
    ASCII form stored envelope digests depend on."""
    return shared_canonical_json(value, ascii_only=True)


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def build_message_schemas() -> None:
    """Build pydantic-ai's message schemas now, at process startup, rather than during a run.

    pydantic-ai defers them (`defer_build`): otherwise the first `encode_history` of a worker process builds the
    schema of the whole message union inside its first run's first boundary, and the first tool-return event
    streamed builds that class's own serializer. The control process validates and dumps messages with the same
    adapter (a thread created with a history, a run's messages).
    """
    ModelMessagesTypeAdapter.rebuild()
    pending: list[type] = [ToolReturn, BaseToolReturnPart]
    while pending:  # every tool-return class builds its own serializer on first use (`__pydantic_serializer__`)
        cls = pending.pop()
        getattr(cls, "__pydantic_serializer__", None)
        pending.extend(cls.__subclasses__())


def encode_message(message: ModelMessage) -> EncodedMessage:
    """The stored form of one message: its JSON as `ModelMessagesTypeAdapter` dumps it (mode `json`), compact.

    Keys keep the adapter's order (field order, and insertion order inside dicts such as tool-call arguments)
    instead of being sorted: sorting would reorder user dicts and the rebuilt state would no longer dump
    byte-identically (S-43). The form is deterministic, so the same message always has the same body and digest.
    Bodies are ASCII (non-ASCII escaped), so their length in characters is their size in bytes."""
    body = _compact_json(ModelMessagesTypeAdapter.dump_python([message], mode="json")[0])
    return EncodedMessage(body=body, digest=sha256_hex(body))


def encode_history(messages: Sequence[ModelMessage]) -> list[EncodedMessage]:
    """The stored form of a history, message by message."""
    dumped = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    bodies = [_compact_json(item) for item in dumped]
    return [EncodedMessage(body=body, digest=sha256_hex(body)) for body in bodies]


def encode_history_reusing(
    messages: Sequence[ModelMessage],
    previous_messages: Sequence[ModelMessage],
    previous_encoded: Sequence[EncodedMessage],
) -> list[EncodedMessage]:
    """`encode_history(messages)`, reusing the encoding of the leading messages that are the very same objects.

    §6: the worker keeps the history it last committed in encoded form. The harness never changes a message once
    it is in a run's history, so an identical object has an identical encoding; a replaced message (a rewrite)
    is encoded again from there on. Encoding cost per boundary then follows the new messages, not the history.
    """
    reusable = min(len(messages), len(previous_messages), len(previous_encoded))
    kept = 0
    while kept < reusable and messages[kept] is previous_messages[kept]:
        kept += 1
    return [*previous_encoded[:kept], *encode_history(messages[kept:])] if kept else encode_history(messages)


def encode_envelope(envelope: CheckpointEnvelope) -> EncodedEnvelope:
    """Stored text and digest of an envelope; the worker compares `len(text)` with `worker.envelope_bytes`.

    The text is compact and keeps the model's order; the digest is the SHA-256 of its canonical JSON (sorted keys,
    compact separators) as §6 says, recomputed and compared on read."""
    data = envelope.model_dump(mode="json")
    return EncodedEnvelope(text=_compact_json(data), digest=sha256_hex(canonical_json(data)))


def envelope_for_state(
    state: HarnessState, *, deferred: JsonValue = None, resume_input_consumed: bool = False
) -> CheckpointEnvelope:
    """The envelope of `state` (read through the state's copy-free views)."""
    return CheckpointEnvelope(
        schema_version=state.schema_version,
        thread_id=state.thread_id,
        capabilities=dict(state.capabilities_view()),
        environment=dict(state.environment_view()),
        deferred=deferred,
        resume_input_consumed=resume_input_consumed,
    )


def common_prefix_length(base: Sequence[str], new: Sequence[str]) -> int:
    """Length of the longest common prefix of two digest sequences (`kept`, §6)."""
    limit = min(len(base), len(new))
    for position in range(limit):
        if base[position] != new[position]:
            return position
    return limit


def kept_count(base: Sequence[EncodedMessage], new: Sequence[EncodedMessage]) -> int:
    """`kept` (§6) of a commit: `common_prefix_length` of the two histories' digests. A boundary's history usually
    extends its base with the very same objects (`encode_history_reusing`), so one comparison of the base with the
    new history's head, identity first and at C speed, settles it without a Python loop over every digest, whose
    cost would grow with the history's length."""
    size = len(base)
    if size <= len(new) and list(new[:size]) == list(base):
        return size
    return common_prefix_length([m.digest for m in base], [m.digest for m in new])


def written_bytes(envelope: EncodedEnvelope, packed_messages: str) -> int:
    """`CheckpointWritten.bytes_written` of a commit: its new messages as packed in the row (bodies, digests and
    length prefixes) plus the envelope and its digest (S-42: what grows with the new messages only)."""
    return len(envelope.text) + len(envelope.digest) + len(packed_messages)


def new_checkpoint_id(token_hex: Callable[[int], str] = secrets.token_hex) -> str:
    return "ckp_" + token_hex(16)


# --- statements --------------------------------------------------------------------------------------------------


@cache
def insert_checkpoint_row() -> Insert:
    """One `checkpoints` row; its workspace is the thread's, its `created_at` the database clock.

    Binds `ckp_id`, `ckp_thread_id`, `ckp_run_id`, `ckp_seq`, `ckp_attempt`, `ckp_base_id`, `ckp_kept`,
    `ckp_count`, `ckp_envelope`, `ckp_envelope_digest`, `ckp_messages` (the new messages, packed) and `ckp_usage`
    (`checkpoint_writes()` makes them). A constant: at
    every commit SQLAlchemy neither rebuilds it nor computes its cache key again. The prefix keeps the names
    apart from every column name, so the parameters can go to the commit's other statements too.
    """
    c = checkpoints.c
    workspace = select(threads.c.workspace_id).where(threads.c.id == bindparam("ckp_thread_id")).scalar_subquery()
    return insert(checkpoints).values(
        id=bindparam("ckp_id", type_=c.id.type),
        workspace_id=workspace,
        thread_id=bindparam("ckp_thread_id", type_=c.thread_id.type),
        run_id=bindparam("ckp_run_id", type_=c.run_id.type),
        seq=bindparam("ckp_seq", type_=c.seq.type),
        attempt=bindparam("ckp_attempt", type_=c.attempt.type),
        format=CHECKPOINT_FORMAT,
        base_id=bindparam("ckp_base_id", type_=c.base_id.type),
        kept=bindparam("ckp_kept", type_=c.kept.type),
        count=bindparam("ckp_count", type_=c.count.type),
        envelope=bindparam("ckp_envelope", type_=c.envelope.type),
        envelope_digest=bindparam("ckp_envelope_digest", type_=c.envelope_digest.type),
        messages=bindparam("ckp_messages", type_=c.messages.type),
        usage=bindparam("ckp_usage", type_=c.usage.type),
        created_at=db_now(),
    )


def select_checkpoint(checkpoint_id: str) -> Select[Any]:
    return select(
        checkpoints.c.id,
        checkpoints.c.seq,
        checkpoints.c.format,
        checkpoints.c.count,
        checkpoints.c.envelope,
        checkpoints.c.envelope_digest,
    ).where(checkpoints.c.id == checkpoint_id)


def select_chain(checkpoint_id: str) -> Select[Any]:
    """The checkpoint and its bases, nearest first: `(id, base_id, kept, count, depth)`."""
    c = checkpoints.c
    chain = (
        select(c.id, c.base_id, c.kept, c.count, literal(0).label("depth"))
        .where(c.id == checkpoint_id)
        .cte("chain", recursive=True)
    )
    base = checkpoints.alias("base")
    chain = chain.union_all(
        select(base.c.id, base.c.base_id, base.c.kept, base.c.count, chain.c.depth + 1)
        .join(chain, base.c.id == chain.c.base_id)
        .where(chain.c.depth < _MAX_CHAIN)
    )
    return select(chain.c.id, chain.c.base_id, chain.c.kept, chain.c.count).order_by(chain.c.depth)


def select_message_ranges(ranges: Sequence[tuple[str, int, int]]) -> Select[Any]:
    """Message rows with `lo <= index < hi` of each `(checkpoint_id, lo, hi)`."""
    m = checkpoint_messages.c
    return select(m.checkpoint_id, m.index, m.body, m.digest).where(
        or_(*(and_(m.checkpoint_id == cid, m.index >= lo, m.index < hi) for cid, lo, hi in ranges))
    )


def select_packed(checkpoint_ids: Sequence[str]) -> Select[Any]:
    """The packed messages of the checkpoints that have them (`messages` is NULL on rows written before migration
    0006, whose messages are `checkpoint_messages` rows)."""
    c = checkpoints.c
    return select(c.id, c.kept, c.count, c.messages).where(c.id.in_(list(checkpoint_ids)), c.messages.is_not(None))


async def read_message_ranges(
    conn: AsyncConnection, ranges: Sequence[tuple[str, int, int]]
) -> AsyncIterator[tuple[int, EncodedMessage]]:
    """The messages `lo <= index < hi` of each `(checkpoint_id, lo, hi)` as `(index, message)`, every digest
    verified (`CheckpointCorrupt` on a mismatch); from the packed row where the checkpoint has one, else from its
    `checkpoint_messages` rows. Only the checkpoints named by `ranges` are read, never a whole history."""
    for start in range(0, len(ranges), _RANGES_PER_QUERY):
        batch = ranges[start : start + _RANGES_PER_QUERY]
        wanted = {checkpoint_id: (lo, hi) for checkpoint_id, lo, hi in batch}
        packed = (await conn.execute(select_packed(list(wanted)))).all()
        for row in packed:
            lo, hi = wanted.pop(row.id)
            unpacked = unpack_messages(
                row.messages, checkpoint_id=row.id, first_index=row.kept, count=row.count - row.kept, verify=(lo, hi)
            )
            for index in range(max(lo, row.kept), min(hi, row.count)):
                body, digest = unpacked[index - row.kept]
                yield index, EncodedMessage(body=body, digest=digest)
        legacy = [(checkpoint_id, lo, hi) for checkpoint_id, (lo, hi) in wanted.items()]
        if not legacy:
            continue
        for row in await conn.execute(select_message_ranges(legacy)):
            if sha256_hex(row.body) != row.digest:
                raise CheckpointCorrupt(f"message {row.index} of checkpoint {row.checkpoint_id} fails its digest")
            yield row.index, EncodedMessage(body=row.body, digest=row.digest)


# --- writes ------------------------------------------------------------------------------------------------------


def checkpoint_writes(
    *,
    thread_id: str,
    run_id: str | None,
    seq: int,
    attempt: int | None,
    base_id: str | None,
    base_encoded: Sequence[EncodedMessage],
    new_encoded: Sequence[EncodedMessage],
    envelope: CheckpointEnvelope | EncodedEnvelope,
    checkpoint_id: str | None = None,
    usage: Mapping[str, Any] | None = None,
) -> tuple[list[Insert], dict[str, Any], CheckpointWritten]:
    """One checkpoint row extending `base_id` with only its `count − kept` new messages packed in it (S-40, S-41)
    and the boundary's `usage`: the insert, its parameters and what it writes.

    `base_encoded` is the base's history in stored form as the caller last committed or restored it (§6); it is
    not re-read. The insert reads no row another write of the same commit writes, so a commit may send it
    together with its other writes (`statements.execute_together`).
    """
    if base_id is None and base_encoded:
        raise ValueError("base_encoded must be empty when there is no base checkpoint")
    encoded_envelope = envelope if isinstance(envelope, EncodedEnvelope) else encode_envelope(envelope)
    checkpoint_id = checkpoint_id or new_checkpoint_id()
    kept = kept_count(base_encoded, new_encoded)
    count = len(new_encoded)
    params: dict[str, Any] = {
        "ckp_id": checkpoint_id,
        "ckp_thread_id": thread_id,
        "ckp_run_id": run_id,
        "ckp_seq": seq,
        "ckp_attempt": attempt,
        "ckp_base_id": base_id,
        "ckp_kept": kept,
        "ckp_count": count,
        "ckp_envelope": encoded_envelope.text,
        "ckp_envelope_digest": encoded_envelope.digest,
    }
    fresh = new_encoded[kept:]
    params["ckp_messages"] = packed = pack_messages(fresh)
    params["ckp_usage"] = dict(usage) if usage else None
    written = written_bytes(encoded_envelope, packed)
    statements = [insert_checkpoint_row()]
    return statements, params, CheckpointWritten(id=checkpoint_id, kept=kept, count=count, bytes_written=written)


async def insert_checkpoint(
    conn: AsyncConnection,
    *,
    thread_id: str,
    run_id: str | None,
    seq: int,
    attempt: int | None,
    base_id: str | None,
    base_encoded: Sequence[EncodedMessage],
    new_encoded: Sequence[EncodedMessage],
    envelope: CheckpointEnvelope | EncodedEnvelope,
    checkpoint_id: str | None = None,
) -> CheckpointWritten:
    """Execute `checkpoint_writes()` inside the caller's transaction (fenced for a run's commit)."""
    statements, params, written = checkpoint_writes(
        thread_id=thread_id,
        run_id=run_id,
        seq=seq,
        attempt=attempt,
        base_id=base_id,
        base_encoded=base_encoded,
        new_encoded=new_encoded,
        envelope=envelope,
        checkpoint_id=checkpoint_id,
    )
    for statement in statements:
        await conn.execute(statement, params)
    return written


async def import_history(
    conn: AsyncConnection,
    thread_id: str,
    messages: Sequence[ModelMessage],
    *,
    checkpoint_id: str | None = None,
) -> CheckpointWritten:
    """Store a new thread's `message_history` once, as its `seq = 0` checkpoint without a run (S-45).

    The caller records the returned id as the thread's `base_checkpoint_id`.
    """
    return await insert_checkpoint(
        conn,
        thread_id=thread_id,
        run_id=None,
        seq=0,
        attempt=None,
        base_id=None,
        base_encoded=(),
        new_encoded=encode_history(messages),
        envelope=CheckpointEnvelope(thread_id=thread_id),
        checkpoint_id=checkpoint_id,
    )


# --- reads -------------------------------------------------------------------------------------------------------


def plan_ranges(chain: Sequence[tuple[str, str | None, int, int]]) -> list[tuple[str, int, int]]:
    """The `(checkpoint_id, lo, hi)` row ranges that make up the history of `chain[0]` (pure).

    `chain` lists `(id, base_id, kept, count)` from the checkpoint to its root. Raises `CheckpointCorrupt` for a
    broken chain: a missing base, a `kept` beyond the base's `count`, or a root that keeps messages.
    """
    if not chain:
        raise CheckpointCorrupt("checkpoint not found")
    ranges: list[tuple[str, int, int]] = []
    limit = chain[0][3]
    for position, (checkpoint_id, base_id, kept, count) in enumerate(chain):
        if not 0 <= kept <= count or limit > count:
            raise CheckpointCorrupt(f"checkpoint {checkpoint_id} has an inconsistent kept/count")
        high = min(count, limit)
        if kept < high:
            ranges.append((checkpoint_id, kept, high))
        limit = min(limit, kept)
        is_last = position == len(chain) - 1
        if is_last and (base_id is not None or kept != 0):
            raise CheckpointCorrupt(f"checkpoint {checkpoint_id} extends a missing base")
        if not is_last and chain[position + 1][0] != base_id:
            raise CheckpointCorrupt(f"checkpoint {checkpoint_id} has a broken base chain")
    return ranges


async def load_state(conn: AsyncConnection, checkpoint_id: str) -> LoadedCheckpoint:
    """Rebuild the `HarnessState` of a checkpoint, verifying every body and the envelope (S-43, S-46).

    Message row indexes are absolute positions, so the rows needed to rebuild a checkpoint are, walking from it
    towards the root, `[kept, min(count, limit))` of each checkpoint, where `limit` is the smallest `kept` seen so
    far (`plan_ranges`)."""
    leaf = (await conn.execute(select_checkpoint(checkpoint_id))).one_or_none()
    if leaf is None:
        raise CheckpointCorrupt(f"checkpoint {checkpoint_id} not found")
    chain = [tuple(row) for row in (await conn.execute(select_chain(checkpoint_id))).all()]
    ranges = plan_ranges(chain)
    bodies: list[EncodedMessage | None] = [None] * leaf.count
    async for index, message in read_message_ranges(conn, ranges):
        if bodies[index] is not None:
            raise CheckpointCorrupt(f"message {index} of checkpoint {checkpoint_id} is stored twice")
        bodies[index] = message
    missing = [index for index, body in enumerate(bodies) if body is None]
    if missing:
        raise CheckpointCorrupt(f"checkpoint {checkpoint_id} is missing {len(missing)} message row(s)")
    encoded: list[EncodedMessage] = bodies  # type: ignore[assignment]
    envelope = _verified_envelope(checkpoint_id, leaf.envelope, leaf.envelope_digest)
    try:
        messages = ModelMessagesTypeAdapter.validate_json("[" + ",".join(m.body for m in encoded) + "]")
        state = HarnessState(
            schema_version=envelope.schema_version,
            thread_id=envelope.thread_id,
            message_history=tuple(messages),
            capabilities=envelope.capabilities,
            environment=envelope.environment,
        )
    except ValidationError as exc:
        raise CheckpointCorrupt(f"checkpoint {checkpoint_id} does not decode: {exc.error_count()} error(s)") from exc
    return LoadedCheckpoint(
        id=leaf.id,
        seq=leaf.seq,
        format=leaf.format,
        state=state,
        encoded=encoded,
        deferred_json=envelope.deferred,
        resume_input_consumed=envelope.resume_input_consumed,
    )


async def load_envelope(conn: AsyncConnection, checkpoint_id: str) -> CheckpointEnvelope:
    """A checkpoint's verified envelope without its messages (the run view reads `candor.recovery` from it)."""
    leaf = (await conn.execute(select_checkpoint(checkpoint_id))).one_or_none()
    if leaf is None:
        raise CheckpointCorrupt(f"checkpoint {checkpoint_id} not found")
    return _verified_envelope(checkpoint_id, leaf.envelope, leaf.envelope_digest)


def _verified_envelope(checkpoint_id: str, text: str | None, digest: str) -> CheckpointEnvelope:
    if text is None:
        raise CheckpointCorrupt(f"checkpoint {checkpoint_id} has no envelope (cleared by cleanup)")
    try:
        data = json.loads(text)
        matches = sha256_hex(canonical_json(data)) == digest
    except ValueError as exc:
        raise CheckpointCorrupt(f"envelope of checkpoint {checkpoint_id} is not JSON") from exc
    if not matches:
        raise CheckpointCorrupt(f"envelope of checkpoint {checkpoint_id} fails its digest")
    try:
        return CheckpointEnvelope.model_validate_json(text)
    except ValidationError as exc:
        raise CheckpointCorrupt(f"envelope of checkpoint {checkpoint_id} is invalid") from exc
