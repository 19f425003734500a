"""The status triggers the database runs agree with the protocol's transition tables, pair by pair, on both backends.

The triggers are rendered from protocol/transitions.py (tables.RUN_GUARD, tables.ATTEMPT_GUARD); these tests hold
the SQL the database executes to `may_update_run` / `may_update_attempt` and to the creation rule, so a change to
either side that the other does not follow fails here. Each guard is installed on a bare scratch table (an integer
key and `status`) so the verdict is the trigger's alone, not that of the real tables' other constraints.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from candor.service.protocol.transitions import (
    ATTEMPT_STATUSES,
    RUN_STATUSES,
    can_transition,
    can_transition_attempt,
    may_update_attempt,
    may_update_run,
)
from candor.service.store.db.dialect import dialect_name
from candor.service.store.db.engine import create_engine, write_transaction
from candor.service.store.schema.dialect import StatusGuard, guard_ddl
from candor.service.store.schema.tables import ATTEMPT_GUARD, RUN_GUARD

CASES = [
    pytest.param(RUN_GUARD, RUN_STATUSES, may_update_run, can_transition, id="runs"),
    pytest.param(ATTEMPT_GUARD, ATTEMPT_STATUSES, may_update_attempt, can_transition_attempt, id="run_attempts"),
]


async def _database_verdicts(
    url: str, guard: StatusGuard, statuses: Sequence[str]
) -> tuple[dict[tuple[str, str], bool], dict[str, bool]]:
    """Which updates (from, to) and which inserts (status) the guard's triggers let through on a bare table."""
    pairs = list(itertools.product(statuses, statuses))
    engine = create_engine(url)
    try:
        async with write_transaction(engine) as conn:
            await conn.exec_driver_sql(f"CREATE TABLE {guard.table} (id INTEGER PRIMARY KEY, status VARCHAR(32))")
            # Rows start in every status, written before the triggers exist (they would refuse most of them).
            for row_id, (source, _) in enumerate(pairs):
                await conn.execute(
                    text(f"INSERT INTO {guard.table} (id, status) VALUES (:id, :status)"),
                    {"id": row_id, "status": source},
                )
            for statement in guard_ddl(guard, dialect_name(conn)):
                await conn.exec_driver_sql(statement)
        updates = {
            pair: await _passes(
                engine, guard, f"UPDATE {guard.table} SET status = :status WHERE id = :id", id=row_id, status=pair[1]
            )
            for row_id, pair in enumerate(pairs)
        }
        inserts = {
            status: await _passes(
                engine, guard, f"INSERT INTO {guard.table} (id, status) VALUES (:id, :status)", id=-1 - n, status=status
            )
            for n, status in enumerate(statuses)
        }
    finally:
        await engine.dispose()
    return updates, inserts


async def _passes(engine: Any, guard: StatusGuard, statement: str, **params: Any) -> bool:
    try:
        async with write_transaction(engine) as conn:
            changed = (await conn.execute(text(statement), params)).rowcount
    except IntegrityError as refused:
        assert f"candor: {guard.table}:" in str(refused)  # the guard refused it, not something else
        return False
    assert changed == 1
    return True


@pytest.mark.parametrize(("guard", "statuses", "may_update", "may_create"), CASES)
async def test_triggers_decide_every_status_pair_as_the_protocol(
    empty_db: str,
    guard: StatusGuard,
    statuses: Sequence[str],
    may_update: Callable[[Any, Any], bool],
    may_create: Callable[[Any, Any], bool],
) -> None:
    """S-6, S-7, S-8: for every (from, to) pair of run and attempt statuses, including same-status rewrites, the
    database's trigger allows the update exactly when `may_update_run` / `may_update_attempt` does, and a row may be
    inserted exactly in the status the transition table creates rows in."""
    updates, inserts = await _database_verdicts(empty_db, guard, statuses)
    assert updates == {pair: may_update(*pair) for pair in updates}
    assert inserts == {status: may_create(None, status) for status in statuses}
