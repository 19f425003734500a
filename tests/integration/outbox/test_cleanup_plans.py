"""Checkpoint cleanup reads no table whole (§9.6, S-47, migration 0005).

A cleanup page asks which runs, threads and checkpoints point at its checkpoints. Every one of its statements must
find its rows through an index: the tables grow with every run a service stores, and a page that scans them costs
more with every run sealed before it. The test asks each database for the plan of every statement a real page
sent: PostgreSQL with sequential scans priced out (`enable_seqscan = off`, so a `Seq Scan` left in a plan means no
index can serve it), SQLite's `EXPLAIN QUERY PLAN` (a `SCAN` of a table instead of a `SEARCH`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from candor.service.store.outbox.cleanup import cleanup_checkpoint_page
from candor.service.worker import WorkerLoop

from outbox import support
from worker.support import add_thread_run, run_row

_SCANNED = re.compile(r"\bSeq Scan on (\w+)|^SCAN (\w+)")


@contextmanager
def statements_with_parameters(engine: AsyncEngine) -> Iterator[list[tuple[str, Any]]]:
    """Every statement SQLAlchemy sends on `engine` meanwhile, with the parameters the driver received."""
    sent: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_args: Any) -> None:
        sent.append((statement, parameters))

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


async def scanned_tables(conn: AsyncConnection, statement: str, parameters: Any) -> set[str]:
    """The tables the database would read whole to run `statement` (see the module docstring)."""
    if conn.dialect.name == "postgresql":
        await conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plan = [row[0] for row in await conn.exec_driver_sql(f"EXPLAIN {statement}", parameters)]
    else:
        plan = [row[-1] for row in await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)]
    return {name for line in plan for match in _SCANNED.finditer(line.strip()) for name in match.groups() if name}


async def test_a_cleanup_page_searches_indexes_only(db, tenant, clock) -> None:
    """§9.6, S-47: every statement of a checkpoint cleanup page (the page, the runs and threads pointing at it, the
    checkpoints extending it, the envelope update) is served by an index on both databases."""
    service = support.make_service(db.url, db.engine, clock=clock)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools")
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    assert (await run_row(db.engine, ref.run_id))["status"] == "completed"

    with statements_with_parameters(db.engine) as sent:
        touched, _ = await cleanup_checkpoint_page(db.engine, run_id=ref.run_id)
    assert touched >= 1  # the page cleared an envelope, so every lookup of a page ran
    cleanup = [(s, p) for s, p in sent if re.match(r"\s*(SELECT|UPDATE|DELETE)\b", s, re.IGNORECASE)]
    assert any("base_checkpoint_id" in s for s, _ in cleanup) and any("base_id IN" in s for s, _ in cleanup)

    async with db.engine.connect() as conn:
        async with conn.begin():
            scans = {statement: await scanned_tables(conn, statement, parameters) for statement, parameters in cleanup}
    assert {statement: tables for statement, tables in scans.items() if tables} == {}


async def test_a_cleanup_page_sends_the_same_statements_whatever_its_size(db, tenant, clock) -> None:
    """§9.6, S-47: a page names its checkpoints by their `seq` range, not by a list of ids, so a page of one
    checkpoint and a full page send the same statements with the same number of parameters. A list rendered one
    parameter per checkpoint was most of a page's CPU in the control process, and a new statement text for the
    driver and the database to prepare at every length."""
    service = support.make_service(db.url, db.engine, clock=clock)
    async with db.engine.begin() as conn:
        small, full = [await add_thread_run(conn, tenant, script="tools") for _ in range(2)]
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)

    async def page(run_id: str, limit: int) -> list[tuple[str, int]]:
        with statements_with_parameters(db.engine) as sent:
            touched, _ = await cleanup_checkpoint_page(db.engine, run_id=run_id, limit=limit)
        assert touched >= 1  # every lookup of a page ran
        return [(statement, len(parameters)) for statement, parameters in sent]

    one = await page(small.run_id, 1)
    many = await page(full.run_id, 1000)
    assert one == many
