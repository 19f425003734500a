"""The database itself rejects what S-1, S-2, S-6, S-7, S-8, S-9 and S-40 forbid, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from candor.service.store.db.dialect import dialect_name
from candor.service.store.db.engine import write_transaction
from candor.service.store.schema.dialect import db_now, insert_ignoring_conflicts, violated_constraint
from candor.service.store.schema.tables import (
    checkpoint_messages,
    checkpoints,
    inbox_entries,
    outbox,
    run_attempts,
    runs,
    usage_records,
)

from .rows import add_attempt, add_principal, add_run, add_thread, add_workspace, claim, new_id

Step = Callable[[AsyncConnection], Awaitable[Any]]

SEALED: dict[str, dict[str, Any]] = {
    # Column values each sealed status needs besides status and sealed_at (S-4, S-5).
    "completed": {"checkpoint_seq": 1},
    "waiting": {"checkpoint_seq": 1, "pending": {"approvals": [], "calls": []}, "wait_reason": "call"},
    "failed": {"failure": {"code": "attempt_failed", "message": "x"}},
    "cancelled": {"failure": {"code": "cancelled", "message": "x"}},
}


async def _rejected(db: Any, step: Step) -> IntegrityError:
    with pytest.raises(IntegrityError) as caught:
        async with write_transaction(db.engine) as conn:
            await step(conn)
    return caught.value


async def _run(db: Any, **values: Any) -> tuple[str, str, str]:
    async with write_transaction(db.engine) as conn:
        workspace_id = await add_workspace(conn)
        thread_id = await add_thread(conn, workspace_id)
        run_id = await add_run(conn, workspace_id, thread_id, **values)
    return workspace_id, thread_id, run_id


async def _running(db: Any) -> tuple[str, str, str, str]:
    workspace_id, thread_id, run_id = await _run(db)
    async with write_transaction(db.engine) as conn:
        attempt_id = await claim(conn, workspace_id, run_id)
    return workspace_id, thread_id, run_id, attempt_id


async def _seal(db: Any, run_id: str, attempt_id: str, status: str) -> None:
    async with write_transaction(db.engine) as conn:
        await conn.execute(update(run_attempts).where(run_attempts.c.id == attempt_id).values(status="succeeded"))
        await conn.execute(update(runs).where(runs.c.id == run_id).values(checkpoint_seq=1))
        await conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(status=status, current_attempt_id=None, sealed_at=db_now(), **SEALED[status])
        )


def _set_run(run_id: str, **values: Any) -> Step:
    return lambda conn: conn.execute(update(runs).where(runs.c.id == run_id).values(**values))


def _set_attempt(attempt_id: str, **values: Any) -> Step:
    return lambda conn: conn.execute(update(run_attempts).where(run_attempts.c.id == attempt_id).values(**values))


async def test_one_live_run_per_thread(db: Any) -> None:
    """S-1: a second accepted run on a thread is rejected; once the first is sealed another may start."""
    workspace_id, thread_id, run_id = await _run(db)
    error = await _rejected(db, lambda conn: add_run(conn, workspace_id, thread_id))
    assert violated_constraint(error) == "uq_runs_live_thread"
    async with write_transaction(db.engine) as conn:
        await _set_run(run_id, status="cancelled", sealed_at=db_now(), failure={"code": "cancelled"})(conn)
        await add_run(conn, workspace_id, thread_id)


async def test_one_live_attempt_per_run(db: Any) -> None:
    """S-2: a second leased attempt of the same run is rejected; after the first finishes, another is allowed."""
    workspace_id, _, run_id, attempt_id = await _running(db)
    error = await _rejected(db, lambda conn: add_attempt(conn, workspace_id, run_id, number=2))
    assert violated_constraint(error) == "uq_run_attempts_live_run"
    async with write_transaction(db.engine) as conn:
        await _set_attempt(attempt_id, status="failed", failure={"code": "lease_expired"})(conn)
        second = await add_attempt(conn, workspace_id, run_id, number=2)
        await _set_attempt(second, status="failed", failure={"code": "lease_expired"})(conn)
    error = await _rejected(db, lambda conn: add_attempt(conn, workspace_id, run_id, number=1))
    assert violated_constraint(error) == "uq_run_attempts_run_id_number"


@pytest.mark.parametrize("status", sorted(SEALED))
async def test_sealed_run_is_immutable(db: Any, status: str) -> None:
    """S-6: any update of a sealed run is rejected by the database."""
    _, _, run_id, attempt_id = await _running(db)
    await _seal(db, run_id, attempt_id, status)
    error = await _rejected(db, _set_run(run_id, version=runs.c.version + 1))
    assert "immutable" in str(error)
    await _rejected(db, _set_run(run_id, cancel_requested_at=db_now()))


ALLOWED_MOVES = [
    ("accepted", "running"),
    ("accepted", "cancelled"),
    ("accepted", "failed"),
    ("running", "accepted"),
    ("running", "completed"),
    ("running", "waiting"),
    ("running", "failed"),
    ("running", "cancelled"),
]
FORBIDDEN_MOVES = [
    ("accepted", "waiting"),
    ("accepted", "completed"),
    ("completed", "running"),
    ("waiting", "accepted"),
    ("failed", "running"),
    ("cancelled", "accepted"),
]


def _values_for(target: str, attempt_id: str | None) -> dict[str, Any]:
    values: dict[str, Any] = {"status": target, "current_attempt_id": attempt_id if target == "running" else None}
    if target in SEALED:
        values.update(sealed_at=db_now(), **SEALED[target])
    return values


async def _run_in(db: Any, status: str) -> tuple[str, str]:
    """A run in `status`, reached through allowed moves; returns (run id, a live attempt id of another run)."""
    workspace_id, _, run_id, attempt_id = await _running(db)
    if status == "accepted":
        async with write_transaction(db.engine) as conn:
            await _set_attempt(attempt_id, status="yielded", yield_reason="handoff")(conn)
            await _set_run(run_id, status="accepted", current_attempt_id=None)(conn)
    elif status in SEALED:
        await _seal(db, run_id, attempt_id, status)
    async with write_transaction(db.engine) as conn:
        other_thread = await add_thread(conn, workspace_id)
        other_run = await add_run(conn, workspace_id, other_thread)
        spare_attempt = await add_attempt(conn, workspace_id, other_run)
    return run_id, spare_attempt


@pytest.mark.parametrize(("source", "target"), ALLOWED_MOVES)
async def test_spec_transitions_are_allowed(db: Any, source: str, target: str) -> None:
    """S-7 (positive side): every §5.2 transition passes the guard."""
    run_id, spare_attempt = await _run_in(db, source)
    async with write_transaction(db.engine) as conn:
        await conn.execute(update(runs).where(runs.c.id == run_id).values(checkpoint_seq=1))
        await _set_run(run_id, **_values_for(target, spare_attempt))(conn)
        assert (await conn.execute(select(runs.c.status).where(runs.c.id == run_id))).scalar_one() == target


@pytest.mark.parametrize(("source", "target"), FORBIDDEN_MOVES)
async def test_other_transitions_are_rejected(db: Any, source: str, target: str) -> None:
    """S-7: transitions outside §5.2 are rejected by the database."""
    run_id, spare_attempt = await _run_in(db, source)
    if source == "accepted":
        async with write_transaction(db.engine) as conn:
            await conn.execute(update(runs).where(runs.c.id == run_id).values(checkpoint_seq=1))
    await _rejected(db, _set_run(run_id, **_values_for(target, spare_attempt)))


async def test_runs_are_created_accepted(db: Any) -> None:
    """S-7: `(none) → accepted` is the only way a run comes into existence."""
    workspace_id, thread_id, _ = await _run(db, status="accepted")
    async with write_transaction(db.engine) as conn:
        await _set_run(_, status="cancelled", sealed_at=db_now(), failure={"code": "cancelled"})(conn)
    error = await _rejected(
        db, lambda conn: add_run(conn, workspace_id, thread_id, status="completed", checkpoint_seq=1, sealed_at=1.0)
    )
    assert "inserted with status accepted" in str(error)


@pytest.mark.parametrize("status", ["succeeded", "yielded", "failed", "cancelled"])
async def test_finished_attempt_is_immutable(db: Any, status: str) -> None:
    """S-8: a finished attempt cannot be modified."""
    _, _, _, attempt_id = await _running(db)
    values: dict[str, Any] = {"status": status, "finished_at": db_now()}
    if status == "yielded":
        values["yield_reason"] = "handoff"
    async with write_transaction(db.engine) as conn:
        await _set_attempt(attempt_id, **values)(conn)
    await _rejected(db, _set_attempt(attempt_id, heartbeat_at=db_now()))
    await _rejected(db, _set_attempt(attempt_id, status="running"))


async def test_running_attempt_cannot_return_to_leased(db: Any) -> None:
    """S-8: `leased → running` is allowed, `running → leased` is rejected."""
    _, _, _, attempt_id = await _running(db)
    async with write_transaction(db.engine) as conn:
        await _set_attempt(attempt_id, status="running", started_at=db_now(), harness_run_id=new_id("run"))(conn)
    error = await _rejected(db, _set_attempt(attempt_id, status="leased"))
    assert "status change not allowed" in str(error)


async def test_expired_lease_cannot_be_extended(db: Any) -> None:
    """S-9: pushing out a live lease works; once `lease_expires_at` has passed, extending it is rejected."""
    _, _, _, attempt_id = await _running(db)
    async with write_transaction(db.engine) as conn:
        await _set_attempt(attempt_id, lease_expires_at=db_now() + 60)(conn)  # a renewal of a live lease
        await _set_attempt(attempt_id, lease_expires_at=db_now() - 1)(conn)  # shortening is allowed
    error = await _rejected(db, _set_attempt(attempt_id, lease_expires_at=db_now() + 30))
    assert "expired lease" in str(error)


async def test_charged_attempts_are_bounded(db: Any) -> None:
    """CHECK 0 <= attempts <= max_attempts on runs (S-14, S-30 rely on it)."""
    _, _, run_id = await _run(db)
    error = await _rejected(db, _set_run(run_id, attempts=4))
    assert violated_constraint(error) == "ck_runs_attempts"
    await _rejected(db, _set_run(run_id, attempts=-1))


async def test_resume_request_key_is_unique_per_principal(db: Any) -> None:
    """uq_runs_resume_request: one successor per (resumed_by_id, request_key) (S-83)."""
    workspace_id, thread_id, run_id = await _run(db, resumed_by_id="key_a", request_key="k")
    async with write_transaction(db.engine) as conn:
        await _set_run(run_id, status="cancelled", sealed_at=db_now(), failure={"code": "cancelled"})(conn)
    error = await _rejected(db, lambda c: add_run(c, workspace_id, thread_id, resumed_by_id="key_a", request_key="k"))
    assert violated_constraint(error) == "uq_runs_resume_request"


async def _entry(conn: AsyncConnection, workspace_id: str, thread_id: str, **values: Any) -> None:
    row = {
        "id": new_id("ent"),
        "workspace_id": workspace_id,
        "thread_id": thread_id,
        "kind": "message",
        "delivery": "next_run",
        "payload": {"content": []},
        "size": 2,
        "status": "pending",
        "created_at": db_now(),
    }
    await conn.execute(insert(inbox_entries).values(**(row | values)))


async def test_inbox_uniques(db: Any) -> None:
    """§5.1: positions are unique per thread and positive; request keys are unique per principal (S-91)."""
    workspace_id, thread_id, _ = await _run(db)
    async with write_transaction(db.engine) as conn:
        principal_id = await add_principal(conn, workspace_id)
        await _entry(conn, workspace_id, thread_id, position=1, principal_id=principal_id, request_key="k")
    await _rejected(db, lambda c: _entry(c, workspace_id, thread_id, position=1))
    await _rejected(db, lambda c: _entry(c, workspace_id, thread_id, position=0))
    await _rejected(
        db, lambda c: _entry(c, workspace_id, thread_id, position=2, principal_id=principal_id, request_key="k")
    )
    await _rejected(db, lambda c: _entry(c, workspace_id, thread_id, position=3, status="consumed"))  # S-76


async def test_outbox_dedupe_key_is_unique_per_kind(db: Any) -> None:
    """§9.1: a second row with the same (kind, dedupe_key) is rejected (`enqueue_once` relies on it, S-107)."""
    workspace_id, _, run_id = await _run(db)

    def row(kind: str) -> Step:
        values = {
            "id": new_id("obx"),
            "workspace_id": workspace_id,
            "kind": kind,
            "dedupe_key": run_id,
            "payload": {},
            "status": "pending",
            "available_at": db_now(),
            "created_at": db_now(),
        }
        return lambda conn: conn.execute(insert(outbox).values(**values))

    async with write_transaction(db.engine) as conn:
        await row("child_result")(conn)
        await row("checkpoint_cleanup")(conn)
    await _rejected(db, row("child_result"))
    await _rejected(db, row("email"))
    async with write_transaction(db.engine) as conn:  # what enqueue_once builds on: the duplicate adds nothing
        values = {
            "id": new_id("obx"),
            "workspace_id": workspace_id,
            "kind": "child_result",
            "dedupe_key": run_id,
            "payload": {},
            "status": "pending",
            "available_at": db_now(),
            "created_at": db_now(),
        }
        statement = insert_ignoring_conflicts(outbox, dialect_name(conn), index_elements=["kind", "dedupe_key"])
        assert (await conn.execute(statement.values(**values))).rowcount == 0
        assert (await conn.execute(select(func.count()).select_from(outbox))).scalar_one() == 2


async def test_checkpoint_keys_and_insert_only_rows(db: Any) -> None:
    """§6 and S-40: unique (run_id, seq), primary key (checkpoint_id, index), message and usage rows never updated."""
    workspace_id, thread_id, run_id = await _run(db)

    def checkpoint(checkpoint_id: str, seq: int) -> Step:
        values = {
            "id": checkpoint_id,
            "workspace_id": workspace_id,
            "thread_id": thread_id,
            "run_id": run_id,
            "seq": seq,
            "attempt": 1,
            "format": 1,
            "kept": 0,
            "count": 1,
            "envelope": "{}",
            "envelope_digest": "0" * 64,
            "created_at": db_now(),
        }
        return lambda conn: conn.execute(insert(checkpoints).values(**values))

    def message(checkpoint_id: str) -> Step:
        values = {"checkpoint_id": checkpoint_id, "index": 0, "body": "{}", "digest": "0" * 64}
        return lambda conn: conn.execute(insert(checkpoint_messages).values(**values))

    async with write_transaction(db.engine) as conn:
        await checkpoint("ckp_1", 1)(conn)
        await message("ckp_1")(conn)
        await conn.execute(
            insert(usage_records).values(workspace_id=workspace_id, run_id=run_id, usage={}, created_at=db_now())
        )
    await _rejected(db, checkpoint("ckp_2", 1))
    await _rejected(db, message("ckp_1"))
    await _rejected(db, lambda c: c.execute(update(checkpoint_messages).values(body="[]")))
    await _rejected(db, lambda c: c.execute(update(usage_records).values(usage={"x": 1})))
    async with write_transaction(db.engine) as conn:  # cleanup (§9.6) deletes rows; that stays possible
        await conn.execute(delete(checkpoint_messages).where(checkpoint_messages.c.checkpoint_id == "ckp_1"))


async def test_current_attempt_is_set_exactly_while_running(db: Any) -> None:
    """S-3: `current_attempt_id` is non-null exactly when the run is `running`; the database refuses either
    half of the pair on its own."""
    workspace_id, _, run_id = await _run(db)
    async with write_transaction(db.engine) as conn:
        attempt_id = await add_attempt(conn, workspace_id, run_id)
    await _rejected(db, _set_run(run_id, status="running"))  # running without its attempt
    await _rejected(db, _set_run(run_id, current_attempt_id=attempt_id))  # an attempt on an accepted run
    async with write_transaction(db.engine) as conn:
        await _set_run(run_id, status="running", current_attempt_id=attempt_id, attempts=1)(conn)
    await _rejected(db, _set_run(run_id, current_attempt_id=None))  # running loses its attempt
