"""Reconcile before unknown through the service, on SQLite and PostgreSQL (issue 13 item 2).

A worker dies inside the tools of a response asking for `charge_card` (charged before dying, has a reconciler),
`refund` (not done before dying, has a reconciler), `notify` (no reconciler) and `lookup` (retry-safe). After its
lease expires the next attempt reconciles the charge (no second charge), reruns the refund once under the same call
key, closes `notify` with the unknown outcome and replays `lookup`; `GET /v1/runs/{id}` lists all four, and the
run's messages carry the `candor.recovery` marks. Rules: S-27, S-28, S-29 (recovery after lease expiry), H-43,
H-46, H-47 (as extended by docs/state-and-resume.md, "Reconciling against an idempotent API").
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from candor.service.http import create_app
from candor.service.store.db.engine import write_transaction
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import run_attempts
from candor.service.store.workspaces import auth as auth
from candor.service.worker import WorkerLoop
from candor.tools import CALL_KEY_METADATA_KEY, RECOVERY_METADATA_KEY, UNKNOWN_OUTCOME_METADATA_KEY

from worker import support
from worker.support import add_thread_run, run_row


async def _get(service: Any, workspace_id: str, *paths: str) -> list[Any]:
    """`GET` each path through the HTTP app with a new read key of the workspace; the JSON bodies."""
    async with write_transaction(service.engine) as conn:
        created = await auth.create_principal(
            conn, workspace_id=workspace_id, permissions=["read"], entropy=service.entropy
        )
    headers = {"Authorization": f"Bearer {created.secret}"}
    transport = httpx.ASGITransport(app=create_app(service, role="all"))
    async with httpx.AsyncClient(transport=transport, base_url="http://candor.test") as client:
        return [(await client.get(path, headers=headers)).json() for path in paths]


async def test_recovery_reconciles_reruns_and_reports_each_call(db, tenant, control) -> None:
    service = support.make_service(db.url, db.engine, lease_seconds=30)  # never runs out while the worker lives
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="pay")
    control.tool_gate = asyncio.Event()  # the tools start, then hang: the worker "dies" there
    first = WorkerLoop(service, worker_id="dying")
    task = asyncio.create_task(first.run_forever())

    async def all_tools_started() -> bool:
        return len(control.ledger) == 4

    await support.wait_for(all_tools_started)
    await support.kill_worker(first, task)
    control.tool_gate = None
    assert list(control.payments.values()) == ["ch_1"]  # charged before the crash; the refund never happened
    charge_key = next(iter(control.payments))

    async def lease_run_out() -> bool:  # moving an expiry earlier is allowed (S-9)
        # The "dead" worker lives in this process: a transaction its aiosqlite thread had begun may still be
        # finishing (a real crash takes the process and its lock with it). Wait for SQLite's writer lock.
        try:
            async with db.engine.begin() as conn:
                await conn.execute(
                    update(run_attempts)
                    .where(run_attempts.c.run_id == ref.run_id)
                    .values(lease_expires_at=db_now() - 1)
                )
        except OperationalError as error:
            if "locked" not in str(error):
                raise
            return False
        return True

    await support.wait_for(lease_run_out, timeout=30, interval=0.2)

    await support.wait_for_lease_expiry(service)
    await support.make_due(db.engine, ref.run_id)
    survivor = support.make_service(db.url, db.engine, lease_seconds=10)
    await WorkerLoop(survivor, worker_id="second").run_until_idle(timeout=30)

    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["attempts"]) == ("completed", 2)
    assert run["output"] == "charge_card=success, refund=success, notify=interrupted, lookup=success"
    # One charge, one refund: the charge was reconciled, the refund rerun once under its own stable key.
    assert sorted(control.payments.values()) == ["ch_1", "re_2"]
    assert len(control.reconciled_keys) == 2 and charge_key in control.reconciled_keys
    assert [line.split()[0] for line in control.ledger].count("charge") == 1
    assert [line.split()[0] for line in control.ledger].count("refund") == 2  # entered twice, effect once

    view, messages_page, runs_page = await _get(
        survivor,
        tenant.workspace_id,
        f"/v1/runs/{ref.run_id}",
        f"/v1/runs/{ref.run_id}/messages",
        f"/v1/threads/{ref.thread_id}/runs",
    )
    messages, listed = messages_page["items"], runs_page["items"]
    # docs/mcp.md: each entry also says why, and where the tool's retry-safety came from (here the decorator).
    unchanged = {"declaration_changed": False}
    assert view["recovery"] == [
        {
            "tool_call_id": "call_charge",
            "tool_name": "charge_card",
            "outcome": "reconciled",
            "reason": "reconciled",
            "declared_by": "none",
            **unchanged,
        },
        {
            "tool_call_id": "call_refund",
            "tool_name": "refund",
            "outcome": "rerun",
            "reason": "not_done",
            "declared_by": "none",
            **unchanged,
        },
        {
            "tool_call_id": "call_notify",
            "tool_name": "notify",
            "outcome": "unknown",
            "reason": "not_retry_safe",
            "declared_by": "none",
            **unchanged,
        },
        {
            "tool_call_id": "call_lookup",
            "tool_name": "lookup",
            "outcome": "replayed",
            "reason": "retry_safe",
            "declared_by": "decorator",
            **unchanged,
        },
    ]
    assert listed[0]["id"] == ref.run_id and "recovery" not in listed[0]  # only the single-run read has it
    returns = {
        part["tool_call_id"]: part
        for message in messages
        if message["kind"] == "request"
        for part in message["parts"]
        if part["part_kind"] == "tool-return"
    }
    assert returns["call_charge"]["content"] == "ch_1" and returns["call_charge"]["outcome"] == "success"
    assert returns["call_charge"]["metadata"] == {
        RECOVERY_METADATA_KEY: "reconciled",
        CALL_KEY_METADATA_KEY: charge_key,
    }
    assert returns["call_refund"]["content"] == "re_2"
    assert returns["call_refund"]["metadata"] == {RECOVERY_METADATA_KEY: "rerun"}
    assert returns["call_notify"]["metadata"] == {UNKNOWN_OUTCOME_METADATA_KEY: True}
    assert returns["call_lookup"]["metadata"] == {RECOVERY_METADATA_KEY: "replayed"}


async def test_a_run_without_recovery_reports_none(db, service, tenant, control) -> None:
    """An uninterrupted run: `recovery` is an empty list on `GET /v1/runs/{id}`."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="pay")
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    (view,) = await _get(service, tenant.workspace_id, f"/v1/runs/{ref.run_id}")
    assert (view["status"], view["recovery"]) == ("completed", [])
    assert view["output"] == "charge_card=success, refund=success, notify=success, lookup=success"
