"""Minimal rows for store tests (workspace, thread, run, attempt), inserted directly with the database clock."""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import insert, update
from sqlalchemy.ext.asyncio import AsyncConnection

from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import principals, run_attempts, runs, threads, workspaces


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


async def add_workspace(conn: AsyncConnection) -> str:
    workspace_id = new_id("wsp")
    await conn.execute(insert(workspaces).values(id=workspace_id, name=workspace_id, created_at=db_now()))
    return workspace_id


async def add_principal(conn: AsyncConnection, workspace_id: str) -> str:
    principal_id = new_id("key")
    await conn.execute(
        insert(principals).values(
            id=principal_id,
            workspace_id=workspace_id,
            name="test",
            secret_hash=secrets.token_hex(32),
            permissions=["read", "run", "admin"],
            created_at=db_now(),
        )
    )
    return principal_id


async def add_thread(conn: AsyncConnection, workspace_id: str, **values: Any) -> str:
    thread_id = values.pop("id", None) or new_id("thr")
    row: dict[str, Any] = {
        "id": thread_id,
        "workspace_id": workspace_id,
        "origin": "new",
        "agent": "demo",
        "created_at": db_now(),
        "updated_at": db_now(),
    }
    await conn.execute(insert(threads).values(**(row | values)))
    return thread_id


async def add_run(conn: AsyncConnection, workspace_id: str, thread_id: str, **values: Any) -> str:
    run_id = values.pop("id", None) or new_id("run")
    row: dict[str, Any] = {
        "id": run_id,
        "workspace_id": workspace_id,
        "thread_id": thread_id,
        "agent": "demo",
        "principal_id": "key_" + "0" * 32,
        "authority": {"principal_id": "key_" + "0" * 32, "permissions": ["run"]},
        "options": {},
        "options_digest": "0" * 64,
        "trigger": "input",
        "lineage": "root",
        "status": "accepted",
        "available_at": db_now(),
        "max_attempts": 3,
        "created_at": db_now(),
    }
    row.update(values)
    await conn.execute(insert(runs).values(**row))
    return run_id


async def add_attempt(
    conn: AsyncConnection, workspace_id: str, run_id: str, *, number: int = 1, lease_seconds: float = 30.0
) -> str:
    attempt_id = new_id("att")
    await conn.execute(
        insert(run_attempts).values(
            id=attempt_id,
            workspace_id=workspace_id,
            run_id=run_id,
            number=number,
            status="leased",
            start_reason="initial" if number == 1 else "recovery",
            worker_id="worker-1",
            lease_token_hash="0" * 64,
            lease_expires_at=db_now() + lease_seconds,
            heartbeat_at=db_now(),
            created_at=db_now(),
            updated_at=db_now(),
        )
    )
    return attempt_id


async def claim(conn: AsyncConnection, workspace_id: str, run_id: str, *, number: int = 1) -> str:
    """Insert a leased attempt and move the run to `running` with it (what §7.2 does)."""
    attempt_id = await add_attempt(conn, workspace_id, run_id, number=number)
    await conn.execute(
        update(runs)
        .where(runs.c.id == run_id)
        .values(status="running", current_attempt_id=attempt_id, attempts=runs.c.attempts + 1, started_at=db_now())
    )
    return attempt_id
