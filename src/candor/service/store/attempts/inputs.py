"""What an attempt starts from (§7.7 steps 2, 4, 6): its checkpoint, source entry, steer entries and resume requests.

One read transaction: the rebuilt checkpoint (the run's latest, else its start; every digest verified, S-46), the
source entry's payload while it is not consumed, the entries assigned to the run but not consumed, and, for a
resume successor, the `deferred` requests of the waiting run's final envelope.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue, ValidationError
from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ...errors import CheckpointCorrupt
from ..checkpoints.incremental import (
    CheckpointEnvelope,
    LoadedCheckpoint,
    canonical_json,
    load_state,
    select_checkpoint,
    sha256_hex,
)
from ..db.engine import read_transaction
from ..runs.claims import ClaimedRun
from ..schema.tables import inbox_entries, runs
from .seals import AssignedEntry

__all__ = (
    "AttemptStart",
    "select_entry",
    "select_assigned_entries",
    "select_run_checkpoint",
    "load_attempt_start",
    "read_envelope",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptStart:
    """The stored inputs of one attempt."""

    checkpoint: LoadedCheckpoint | None
    """The rebuilt checkpoint, or None when the run starts from nothing."""
    from_own_checkpoint: bool
    """Whether `checkpoint` is one the run committed itself (`runs.checkpoint_id`), not its start."""
    source_payload: dict[str, Any] | None
    """The source entry's payload while that entry is not yet consumed, else None (§7.7 step 4)."""
    assigned: tuple[AssignedEntry, ...]
    """Entries assigned to the run but not consumed, the source entry excluded, in position order (§7.7 step 6)."""
    resume_requests: JsonValue
    """For a resume successor: the `DeferredToolRequests` JSON of the waiting run's final envelope, else None."""


def select_entry(entry_id: str) -> Select[Any]:
    e = inbox_entries.c
    return select(e.id, e.status, e.payload).where(e.id == entry_id)


def select_assigned_entries(run_id: str) -> Select[Any]:
    e = inbox_entries.c
    return select(e.id, e.payload).where(e.assigned_run_id == run_id, e.status == "assigned").order_by(e.position)


def select_run_checkpoint(run_id: str) -> Select[Any]:
    return select(runs.c.checkpoint_id).where(runs.c.id == run_id)


async def load_attempt_start(engine: AsyncEngine, claimed: ClaimedRun) -> AttemptStart:
    """Read everything of §7.7 steps 2, 4 and 6; raises `CheckpointCorrupt` (S-46) or `StoreUnavailable`."""
    run_id = claimed.lease.run_id
    async with read_transaction(engine) as conn:
        checkpoint_id = claimed.checkpoint_id or claimed.start_checkpoint_id
        loaded = await load_state(conn, checkpoint_id) if checkpoint_id is not None else None
        source_payload = None
        if claimed.source_entry_id is not None:
            entry = (await conn.execute(select_entry(claimed.source_entry_id))).one_or_none()
            if entry is not None and entry.status != "consumed":
                source_payload = dict(entry.payload or {})
        rows = (await conn.execute(select_assigned_entries(run_id))).all()
        assigned = tuple(
            AssignedEntry(id=row.id, payload=dict(row.payload or {}))
            for row in rows
            if row.id != claimed.source_entry_id
        )
        resume_requests: JsonValue = None
        if claimed.trigger == "resume" and claimed.parent_run_id is not None:
            parent_checkpoint = (await conn.execute(select_run_checkpoint(claimed.parent_run_id))).scalar_one_or_none()
            if parent_checkpoint is None:
                raise CheckpointCorrupt(f"the waiting run of resume successor {run_id} has no checkpoint")
            if loaded is not None and loaded.id == parent_checkpoint:
                resume_requests = loaded.deferred_json
            else:
                resume_requests = (await read_envelope(conn, parent_checkpoint)).deferred
    return AttemptStart(
        checkpoint=loaded,
        from_own_checkpoint=claimed.checkpoint_id is not None,
        source_payload=source_payload,
        assigned=assigned,
        resume_requests=resume_requests,
    )


async def read_envelope(conn: AsyncConnection, checkpoint_id: str) -> CheckpointEnvelope:
    """The verified envelope of one checkpoint, without its messages (S-46 on a digest mismatch)."""
    row = (await conn.execute(select_checkpoint(checkpoint_id))).one_or_none()
    if row is None or row.envelope is None:
        raise CheckpointCorrupt(f"checkpoint {checkpoint_id} has no envelope")
    try:
        matches = sha256_hex(canonical_json(json.loads(row.envelope))) == row.envelope_digest
        envelope = CheckpointEnvelope.model_validate_json(row.envelope)
    except (ValueError, ValidationError) as exc:
        raise CheckpointCorrupt(f"envelope of checkpoint {checkpoint_id} does not decode") from exc
    if not matches:
        raise CheckpointCorrupt(f"envelope of checkpoint {checkpoint_id} fails its digest")
    return envelope
