"""`statements.fetch_rows`: a constant Core statement sent on asyncpg directly inside SQLAlchemy's transaction on
PostgreSQL (through SQLAlchemy on SQLite) reads the same values, belongs to the same transaction, and fails as
SQLAlchemy would (integrity → `IntegrityError` naming the constraint, unavailable → `StoreUnavailable`)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import bindparam, func, insert, select, text
from sqlalchemy import exc as sa_exc

from candor.service.errors import StoreUnavailable
from candor.service.store.db.engine import create_engine, read_transaction, write_transaction
from candor.service.store.db.statements import fetch_rows
from candor.service.store.schema.dialect import violated_constraint
from candor.service.store.schema.tables import principals, workspaces

from .rows import add_principal, add_workspace
from transactions import sent_in_transactions_on_driver

_PRINCIPAL = select(principals).where(principals.c.id == bindparam("principal_id"))
_NEW_WORKSPACE = (
    insert(workspaces)
    .values(id=bindparam("new_id"), name=bindparam("new_name"), created_at=1.0)
    .returning(workspaces.c.id, workspaces.c.name)
)
_COUNT_WORKSPACES = select(func.count()).select_from(workspaces).where(workspaces.c.name == bindparam("name"))


def _on_driver() -> tuple[list[str], Any]:
    sent: list[str] = []
    return sent, sent_in_transactions_on_driver(lambda _driver, statement: sent.append(statement))


async def test_the_rows_read_the_same_as_through_sqlalchemy_and_only_the_first_statement_begins(db: Any) -> None:
    """JSON columns come back decoded, every column by name; on PostgreSQL the transaction's first statement goes
    through SQLAlchemy (it sends BEGIN with it), the next ones on asyncpg."""
    async with write_transaction(db.engine) as conn:
        principal_id = await add_principal(conn, await add_workspace(conn))
    sent, on_driver = _on_driver()
    async with read_transaction(db.engine) as conn:
        with on_driver:
            first = await fetch_rows(conn, _PRINCIPAL, {"principal_id": principal_id})
            second = await fetch_rows(conn, _PRINCIPAL, {"principal_id": principal_id})
        expected = (await conn.execute(_PRINCIPAL, {"principal_id": principal_id})).mappings().one()
    assert len(sent) == (1 if db.kind == "postgresql" else 0)
    for rows in (first, second):
        (row,) = rows
        assert {name: row[name] for name in expected} == dict(expected)
        assert sorted(row["permissions"]) == ["admin", "read", "run"]


async def test_statements_on_the_driver_belong_to_the_transaction(db: Any) -> None:
    """Rows written inside a transaction that then rolls back are gone, the first statement's included (had it gone
    on asyncpg before SQLAlchemy sent BEGIN, it would have committed on its own); rows that commit stay."""
    name = "statements-rollback"
    with pytest.raises(RuntimeError):
        async with write_transaction(db.engine) as conn:
            await fetch_rows(conn, _NEW_WORKSPACE, {"new_id": "wsp_" + "a" * 32, "new_name": name})
            await fetch_rows(conn, _NEW_WORKSPACE, {"new_id": "wsp_" + "e" * 32, "new_name": name + "-2"})
            raise RuntimeError("roll back")
    async with write_transaction(db.engine) as conn:
        await add_workspace(conn)
        (made,) = await fetch_rows(conn, _NEW_WORKSPACE, {"new_id": "wsp_" + "b" * 32, "new_name": name + "-kept"})
    assert made["name"] == name + "-kept"
    async with read_transaction(db.engine) as conn:
        assert (await conn.execute(_COUNT_WORKSPACES, {"name": name})).scalar() == 0
        assert (await conn.execute(_COUNT_WORKSPACES, {"name": name + "-2"})).scalar() == 0
        assert (await conn.execute(_COUNT_WORKSPACES, {"name": name + "-kept"})).scalar() == 1


async def test_an_integrity_violation_is_sqlalchemys_naming_the_constraint(db: Any) -> None:
    async with write_transaction(db.engine) as conn:
        await add_workspace(conn)
        await fetch_rows(conn, _NEW_WORKSPACE, {"new_id": "wsp_" + "c" * 32, "new_name": "statements-unique"})
    with pytest.raises(sa_exc.IntegrityError) as caught:
        async with write_transaction(db.engine) as conn:
            await add_workspace(conn)
            await fetch_rows(conn, _NEW_WORKSPACE, {"new_id": "wsp_" + "d" * 32, "new_name": "statements-unique"})
    assert violated_constraint(caught.value) == "uq_workspaces_name"


@pytest.mark.postgres
async def test_a_statement_timeout_on_the_driver_is_unavailable(postgres_url: str) -> None:
    engine = create_engine(postgres_url, timeout=0.2)
    try:
        with pytest.raises(StoreUnavailable):
            async with write_transaction(engine) as conn:
                await conn.execute(text("SELECT 1"))
                await fetch_rows(conn, select(func.pg_sleep(2)), {})
    finally:
        await engine.dispose()
