"""Shared setup for command tests: a `Service` on the test database, keys, and worker-like run moves.

The worker is not part of these tests, so `claim_run()` and `seal_run()` move runs the way §7.2 and §7.10 do, with
direct statements that respect the schema's CHECK constraints and triggers.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Collection, Sequence
from typing import Any

from pydantic_ai import DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ToolCallPart
from sqlalchemy import func, insert, select, update

from candor.service.agents import AgentRegistry
from candor.service.core import Service
from candor.service.protocol.authority import Principal
from candor.service.protocol.pending import Pending, build_pending, wait_reason
from candor.service.runtime import SystemEntropy
from candor.service.settings import ServiceSettings
from candor.service.store.checkpoints.incremental import CheckpointEnvelope, encode_history, insert_checkpoint
from candor.service.store.db.engine import read_transaction, write_transaction
from candor.service.store.reads.views import EntryRow, RunRow, ThreadRow, get_entry, load_run, load_thread
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import inbox_entries, run_attempts, runs, threads
from candor.service.store.workspaces import auth as auth

AGENTS = ("demo", "other")
TEXT = {"content": [{"type": "text", "text": "hello"}]}


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}]}


def make_service(db: Any, *, agents: Sequence[str] = AGENTS, **sections: dict[str, Any]) -> Service:
    """A `Service` on the test database; `sections` override settings sections (`worker={...}`)."""
    factories = {name: "tests.fake_agents:factory" for name in agents}
    fields: dict[str, Any] = {
        "database": {"url": db.url},
        "agents": {name: {"factory": f} for name, f in factories.items()},
        **sections,
    }
    settings = ServiceSettings(**fields)
    return Service(
        settings=settings,
        engine=db.engine,
        agents=AgentRegistry(factories),
        entropy=SystemEntropy(),
        wakeups=asyncio.Event(),
    )


async def new_workspace(service: Service) -> str:
    async with write_transaction(service.engine) as conn:
        workspace = await auth.create_workspace(conn, name=f"ws-{secrets.token_hex(4)}", entropy=service.entropy)
    return workspace.id


async def new_key_with_secret(
    service: Service, workspace_id: str | None = None, permissions: Collection[str] = ("read", "run", "admin")
) -> tuple[Principal, str]:
    """A new API key (in a new workspace unless one is given): its principal and its bearer secret."""
    workspace_id = workspace_id or await new_workspace(service)
    async with write_transaction(service.engine) as conn:
        created = await auth.create_principal(
            conn, workspace_id=workspace_id, permissions=permissions, entropy=service.entropy
        )
    principal = Principal(id=created.principal.id, workspace_id=workspace_id, permissions=created.principal.permissions)
    return principal, created.secret


async def new_key(
    service: Service, workspace_id: str | None = None, permissions: Collection[str] = ("read", "run", "admin")
) -> Principal:
    principal, _ = await new_key_with_secret(service, workspace_id, permissions)
    return principal


async def thread_row(service: Service, thread_id: str) -> ThreadRow:
    async with read_transaction(service.engine) as conn:
        row = await load_thread(conn, thread_id=thread_id)
    assert row is not None
    return row


async def run_row(service: Service, run_id: str) -> RunRow:
    async with read_transaction(service.engine) as conn:
        row = await load_run(conn, run_id=run_id)
    assert row is not None
    return row


async def entry_row(service: Service, workspace_id: str, entry_id: str) -> EntryRow:
    async with read_transaction(service.engine) as conn:
        row = await get_entry(conn, workspace_id=workspace_id, entry_id=entry_id)
    assert row is not None
    return row


async def count(service: Service, table: Any, *where: Any) -> int:
    async with read_transaction(service.engine) as conn:
        return int(await conn.scalar(select(func.count()).select_from(table).where(*where)) or 0)


async def claim_run(service: Service, run_id: str) -> str:
    """§7.2: a leased attempt; the run becomes `running`."""
    attempt_id = f"att_{secrets.token_hex(16)}"
    async with write_transaction(service.engine) as conn:
        run = await load_run(conn, run_id=run_id)
        assert run is not None and run.status == "accepted"
        earlier = await conn.scalar(select(func.count()).where(run_attempts.c.run_id == run_id))
        assert earlier is not None
        number = earlier + 1
        await conn.execute(
            insert(run_attempts).values(
                id=attempt_id,
                workspace_id=run.workspace_id,
                run_id=run_id,
                number=number,
                status="leased",
                start_reason="initial" if number == 1 else "recovery",
                worker_id="worker-1",
                lease_token_hash="0" * 64,
                lease_expires_at=db_now() + 30,
                heartbeat_at=db_now(),
                created_at=db_now(),
                updated_at=db_now(),
            )
        )
        await conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(status="running", current_attempt_id=attempt_id, attempts=runs.c.attempts + 1, started_at=db_now())
        )
    return attempt_id


def pending_of(approvals: Sequence[str] = ("a1",), calls: Sequence[str] = ("c1",)) -> dict[str, Any]:
    """`runs.pending` JSON built the way the worker builds it (§5.7)."""
    requests = DeferredToolRequests(
        approvals=[ToolCallPart(tool_name="delete", args={"path": "/x"}, tool_call_id=i) for i in approvals],
        calls=[ToolCallPart(tool_name="lookup", args={"q": "x"}, tool_call_id=i) for i in calls],
    )
    return build_pending(requests).model_dump(mode="json")


async def seal_run(
    service: Service,
    run_id: str,
    status: str,
    *,
    pending: dict[str, Any] | None = None,
    history: Sequence[ModelMessage] = (),
) -> RunRow:
    """§7.10 as the worker does it (claiming first if needed); completed/waiting commit one checkpoint of `history`
    (without a base) first."""
    if (await run_row(service, run_id)).status == "accepted":
        await claim_run(service, run_id)
    async with write_transaction(service.engine) as conn:
        run = await load_run(conn, run_id=run_id)
        assert run is not None and run.status == "running"
        values: dict[str, Any] = {
            "status": status,
            "sealed_at": db_now(),
            "current_attempt_id": None,
            "version": run.version + 1,
        }
        entries = update(inbox_entries).where(
            inbox_entries.c.assigned_run_id == run_id, inbox_entries.c.status == "assigned"
        )
        if status in ("completed", "waiting"):
            seq = run.checkpoint_seq + 1
            written = await insert_checkpoint(
                conn,
                thread_id=run.thread_id,
                run_id=run_id,
                seq=seq,
                attempt=run.attempts,
                base_id=None,
                base_encoded=(),
                new_encoded=encode_history(history),
                envelope=CheckpointEnvelope(thread_id=run.thread_id),
            )
            values |= {"checkpoint_id": written.id, "checkpoint_seq": seq}
            await conn.execute(entries.values(status="consumed", incorporated_checkpoint_seq=seq))
        else:
            values["failure"] = {"code": "cancelled" if status == "cancelled" else "attempt_failed", "message": "x"}
            await conn.execute(entries.values(status="failed", failure={"code": "run_ended", "message": "x"}))
        if status == "waiting":
            pending = pending or pending_of()
            values |= {"pending": pending, "wait_reason": wait_reason(Pending.model_validate(pending))}
        if status == "completed":
            values["output"] = "done"
        attempt_status = {"completed": "succeeded", "waiting": "succeeded"}.get(status, status)
        await conn.execute(
            update(run_attempts)
            .where(run_attempts.c.id == run.current_attempt_id)
            .values(status=attempt_status, finished_at=db_now(), updated_at=db_now())
        )
        await conn.execute(update(runs).where(runs.c.id == run_id).values(**values))
        await conn.execute(
            update(threads).where(threads.c.id == run.thread_id).values(current_run_id=None, last_run_id=run_id)
        )
    return await run_row(service, run_id)


async def commit_history(
    service: Service,
    run: RunRow,
    history: Sequence[ModelMessage],
    *,
    base: tuple[str, Sequence[ModelMessage]] | None,
    seq: int,
) -> str:
    """§6 as a worker commit does it: a checkpoint of `history` extending `base` (its id and history), made the
    run's latest; the run is claimed first (see `claim_run`)."""
    async with write_transaction(service.engine) as conn:
        written = await insert_checkpoint(
            conn,
            thread_id=run.thread_id,
            run_id=run.id,
            seq=seq,
            attempt=1,
            base_id=None if base is None else base[0],
            base_encoded=() if base is None else encode_history(base[1]),
            new_encoded=encode_history(history),
            envelope=CheckpointEnvelope(thread_id=run.thread_id),
        )
        await conn.execute(update(runs).where(runs.c.id == run.id).values(checkpoint_id=written.id, checkpoint_seq=seq))
    return written.id
