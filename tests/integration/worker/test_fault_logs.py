"""What an operator reads when the database fails (issue 34 item 4): the cause in words, host and port; expected
conditions (a lost lease) in one line without a traceback; the `attempt_failed` line names its cause."""

from __future__ import annotations

import asyncio
import io
import logging
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text, update

from candor.service.errors import StoreUnavailable
from candor.service.logs import configure_logging
from candor.service.settings import LogSettings
from candor.service.store.db.engine import create_engine, read_transaction, write_transaction
from candor.service.store.schema.tables import run_attempts
from candor.service.worker import WorkerLoop

from .test_db_blips import Flaky
from worker import support
from worker.support import add_thread_run, run_row


async def test_refused_connection_names_host_and_port(restore_logging: None) -> None:
    """Issue 34 item 4, S-18: a server that refuses connections is "connection refused by 127.0.0.1:<port>", in
    `StoreUnavailable`'s message and in the worker's "Claim failed" line (one line, no traceback)."""
    url = "postgresql://postgres@127.0.0.1:1/none"
    engine = create_engine(url, timeout=1)
    try:
        with pytest.raises(StoreUnavailable, match=r"connection refused by 127\.0\.0\.1:1 \("):
            async with read_transaction(engine) as conn:
                await conn.execute(text("SELECT 1"))
        stream = io.StringIO()
        configure_logging(LogSettings(level="info", format="text"), stream)
        assert await WorkerLoop(support.make_service(url, engine)).claim_once() is None
    finally:
        await engine.dispose()
    (line,) = stream.getvalue().splitlines()
    assert "Claim failed" in line and 'cause="connection refused by 127.0.0.1:1 (' in line


async def test_full_sqlite_database_says_disk_full(tmp_path: Path) -> None:
    """Issue 34 item 4: SQLite's "database or disk is full" (here a real SQLITE_FULL from `max_page_count`) is
    `StoreUnavailable` saying "disk full"."""
    engine = create_engine(f"sqlite:///{tmp_path / 'full.db'}")
    try:
        async with write_transaction(engine) as conn:
            await conn.execute(text("CREATE TABLE t (v BLOB)"))
        with pytest.raises(StoreUnavailable, match="disk full") as raised:
            async with write_transaction(engine) as conn:
                pages = (await conn.execute(text("PRAGMA page_count"))).scalar_one()
                await conn.execute(text(f"PRAGMA max_page_count = {pages + 2}"))
                await conn.execute(text("INSERT INTO t VALUES (zeroblob(1000000))"))
    finally:
        await engine.dispose()
    assert "disk full (OperationalError)" in raised.value.message


async def test_attempt_failed_names_its_cause(db, service, tenant, monkeypatch, caplog) -> None:
    """Issue 34 item 4, S-50: a database fault that is not passing (wrong password) is not retried: the attempt
    ends `attempt_failed` and its "Attempt ended" line says why in words."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="echo", max_attempts=3)
    Flaky(monkeypatch).fail("load_attempt_start", before=1, error=asyncpg.InvalidPasswordError("auth"))
    caplog.set_level(logging.INFO, logger="candor.worker")
    await support.run_one_attempt(service, timeout=30)

    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["attempts"]) == ("accepted", 1)
    [ended] = [r for r in caplog.records if r.getMessage() == "Attempt ended"]
    assert (ended.status, ended.reason) == ("failed", "attempt_failed")
    assert ended.cause == "password authentication failed (InvalidPasswordError)"
    assert not [r for r in caplog.records if r.getMessage() == "Database call failed; retrying"]


async def test_a_lost_lease_is_one_line_without_a_traceback(db, service, tenant, control, caplog) -> None:
    """Issue 34 item 4, S-20, S-22: another worker took the lease while the model worked (the stored token
    changed): the next commit finds it lost, the attempt ends `abandoned` with `lease_lost:token_mismatch`, and no
    line of the worker carries a traceback."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools")
    control.model_gate = asyncio.Event()
    caplog.set_level(logging.INFO, logger="candor.worker")
    worker = asyncio.create_task(WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30))
    await asyncio.wait_for(control.model_entered.wait(), 10)
    async with db.engine.begin() as conn:
        await conn.execute(
            update(run_attempts).where(run_attempts.c.run_id == ref.run_id).values(lease_token_hash="0" * 64)
        )
    control.model_gate.set()
    await worker

    [ended] = [r for r in caplog.records if r.getMessage() == "Attempt ended"]
    assert (ended.status, ended.reason) == ("abandoned", "lease_lost:token_mismatch")
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    assert (await run_row(db.engine, ref.run_id))["status"] == "running"
