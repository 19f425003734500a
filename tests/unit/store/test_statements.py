"""Every named statement builder compiles for both dialects (STYLE habit 4); the database clock renders per dialect."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect

from candor.service.store.checkpoints import incremental as checkpoints
from candor.service.store.db.dialect import DialectName
from candor.service.store.schema.dialect import db_now, insert_ignoring_conflicts
from candor.service.store.schema.tables import outbox

DIALECTS: dict[DialectName, Dialect] = {"sqlite": sqlite.dialect(), "postgresql": postgresql.dialect()}

BUILDERS: dict[str, Callable[[], Any]] = {
    "checkpoints.insert_checkpoint_row": checkpoints.insert_checkpoint_row,
    "checkpoints.select_checkpoint": lambda: checkpoints.select_checkpoint("ckp_x"),
    "checkpoints.select_chain": lambda: checkpoints.select_chain("ckp_x"),
    "checkpoints.select_message_ranges": lambda: checkpoints.select_message_ranges([("ckp_a", 0, 2), ("ckp_b", 2, 5)]),
}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_builders_compile(builder: str, dialect: DialectName) -> None:
    sql = str(BUILDERS[builder]().compile(dialect=DIALECTS[dialect]))
    assert sql.strip()


def test_database_clock_per_dialect() -> None:
    """§2.2: PostgreSQL `clock_timestamp()`, SQLite the host clock."""
    assert "clock_timestamp()" in str(select(db_now()).compile(dialect=DIALECTS["postgresql"]))
    assert "julianday('now')" in str(select(db_now()).compile(dialect=DIALECTS["sqlite"]))


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_insert_ignoring_conflicts_compiles(dialect: DialectName) -> None:
    """The `enqueue_once` building block (S-107): `ON CONFLICT (kind, dedupe_key) DO NOTHING` on both dialects."""
    statement = insert_ignoring_conflicts(outbox, dialect, index_elements=("kind", "dedupe_key"))
    assert "ON CONFLICT (kind, dedupe_key) DO NOTHING" in str(statement.compile(dialect=DIALECTS[dialect]))
