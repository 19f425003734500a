"""The store's renewal query (`leases.select_renewable`) picks exactly the attempts `protocol.fencing.is_renewable`
calls renewable, over a table of snapshots, on SQLite and PostgreSQL.

The store keeps its own SQL rather than calling the pure function: a heartbeat locks only the rows it will renew
(`FOR UPDATE SKIP LOCKED`, S-23), so the filter must run in the database. This test holds that SQL to
`is_renewable`, so the two cannot drift apart. The query runs on bare `runs` / `run_attempts` tables holding only
the columns it reads, so every combination (including ones the real schema's constraints forbid) is tried.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from sqlalchemy import text

from candor.service.protocol.fencing import FenceSnapshot, is_renewable
from candor.service.protocol.transitions import ATTEMPT_STATUSES, RUN_STATUSES
from candor.service.store.db.engine import create_engine, write_transaction
from candor.service.store.runs.claims import to_datetime
from candor.service.store.runs.leases import select_renewable

NOW = 1_700_000_000.0
LEASE_SECONDS = 30.0
WORKER = "worker-a"
# Around 0 and around 2/3 of the lease (20 s), all exact in binary floating point.
REMAINING = (-5.0, 0.0, 0.5, 19.5, 20.0, 20.5, 30.0)

BARE_TABLES = (
    "CREATE TABLE runs (id VARCHAR(64) PRIMARY KEY, status VARCHAR(32), current_attempt_id VARCHAR(64))",
    "CREATE TABLE run_attempts (id VARCHAR(64) PRIMARY KEY, run_id VARCHAR(64), worker_id VARCHAR(64), "
    "status VARCHAR(32), lease_expires_at DOUBLE PRECISION, lease_token_hash VARCHAR(64))",
)


@dataclasses.dataclass(frozen=True)
class Case:
    snapshot: FenceSnapshot
    run_id: str


def _cases() -> list[Case]:
    combinations = itertools.product(RUN_STATUSES, (True, False), ATTEMPT_STATUSES, REMAINING, (WORKER, "worker-b"))
    return [
        Case(
            run_id=f"run_{n}",
            snapshot=FenceSnapshot(
                run_status=run_status,
                run_current_attempt_id=f"att_{n}" if current else None,
                attempt_id=f"att_{n}",
                attempt_status=attempt_status,
                attempt_worker_id=worker,
                lease_token_hash="0" * 64,
                lease_expires_at=to_datetime(NOW + remaining),
            ),
        )
        for n, (run_status, current, attempt_status, remaining, worker) in enumerate(combinations)
    ]


async def _selected(url: str, cases: list[Case]) -> set[str]:
    engine = create_engine(url)
    try:
        async with write_transaction(engine) as conn:
            for statement in BARE_TABLES:
                await conn.exec_driver_sql(statement)
            await conn.execute(
                text("INSERT INTO runs (id, status, current_attempt_id) VALUES (:id, :status, :current)"),
                [
                    {"id": c.run_id, "status": c.snapshot.run_status, "current": c.snapshot.run_current_attempt_id}
                    for c in cases
                ],
            )
            await conn.execute(
                text(
                    "INSERT INTO run_attempts (id, run_id, worker_id, status, lease_expires_at, lease_token_hash) "
                    "VALUES (:id, :run_id, :worker_id, :status, :expires, :hash)"
                ),
                [
                    {
                        "id": c.snapshot.attempt_id,
                        "run_id": c.run_id,
                        "worker_id": c.snapshot.attempt_worker_id,
                        "status": c.snapshot.attempt_status,
                        "expires": c.snapshot.lease_expires_at.timestamp(),
                        "hash": c.snapshot.lease_token_hash,
                    }
                    for c in cases
                ],
            )
            query = select_renewable(
                attempt_ids=[c.snapshot.attempt_id for c in cases],
                worker_id=WORKER,
                now=NOW,
                lease_seconds=LEASE_SECONDS,
            )
            rows: Any = (await conn.execute(query)).all()
    finally:
        await engine.dispose()
    return {row.id for row in rows}


async def test_select_renewable_agrees_with_is_renewable(empty_db: str) -> None:
    """S-23: over every combination of run status, currency, attempt status, remaining lease (around 0 and 2/3)
    and owner, the renewal query selects an attempt exactly when `is_renewable` says so and the attempt is this
    worker's (the query also asks for the owner; the pure function leaves that to the token check)."""
    cases = _cases()
    expected = {
        c.snapshot.attempt_id
        for c in cases
        if c.snapshot.attempt_worker_id == WORKER
        and is_renewable(c.snapshot, now=to_datetime(NOW), lease_seconds=LEASE_SECONDS)
    }
    assert expected  # the table holds renewable attempts, not only refusals
    assert await _selected(empty_db, cases) == expected
