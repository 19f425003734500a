"""Shared pieces of the store benchmarks: throw-away databases, run rows, claims and stored-byte counts.

Not a benchmark itself (private module, skipped by `bench.run_all`). Every database made here is new and removed
afterwards: a SQLite file in a temporary directory, or a PostgreSQL database `candor_bench_<hex>` created on the
server of `--postgres-url` (default `$CANDOR_BENCH_POSTGRES_URL`, else `postgresql://postgres@127.0.0.1:5432/test`)
and dropped with `WITH (FORCE)` at the end.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import insert, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from candor.service.protocol.fencing import Lease
from candor.service.store.db.engine import create_engine
from candor.service.store.runs.claims import claim_runs, start_attempt
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.migration import migrate
from candor.service.store.schema.tables import principals, runs, threads, workspaces

DEFAULT_POSTGRES_URL = os.environ.get("CANDOR_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
BACKENDS = ("sqlite", "postgresql")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q` quantile (0..1) of `values` (p50 = `percentile(v, 0.5)`); `values` must not be empty."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def dsn(url: str) -> str:
    """A plain libpq-style URL (no SQLAlchemy driver suffix)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def postgres_unreachable(url: str) -> str | None:
    """None when the server answers, else why not (one line)."""
    try:
        connection = await asyncpg.connect(dsn(url), timeout=5)
    except Exception as exc:  # noqa: BLE001 - any failure means "skip PostgreSQL", with the reason printed
        return f"{type(exc).__name__}: {exc}"
    await connection.close()
    return None


async def postgres_version(url: str) -> str:
    connection = await asyncpg.connect(dsn(url), timeout=5)
    try:
        return str(await connection.fetchval("SHOW server_version"))
    finally:
        await connection.close()


async def _admin(url: str, statement: str) -> None:
    connection = await asyncpg.connect(dsn(url), timeout=10)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


@asynccontextmanager
async def scratch_postgres(url: str, prefix: str = "candor_bench") -> AsyncIterator[str]:
    """A new, empty PostgreSQL database on the server of `url`; its URL. Dropped afterwards."""
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    await _admin(url, f'CREATE DATABASE "{name}"')
    try:
        yield make_url(dsn(url)).set(database=name).render_as_string(hide_password=False)
    finally:
        await _admin(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass(frozen=True)
class Store:
    backend: str
    url: str
    engine: AsyncEngine


@asynccontextmanager
async def candor_store(backend: str, postgres_url: str) -> AsyncIterator[Store]:
    """A migrated candor store on a fresh database of `backend` (`sqlite` or `postgresql`)."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="candor-bench-") as tmp:
            url = f"sqlite:///{Path(tmp) / 'candor.db'}"
            await migrate(url, lock_timeout=30)
            engine = create_engine(url)
            try:
                yield Store(backend, url, engine)
            finally:
                await engine.dispose()
    elif backend == "postgresql":
        async with scratch_postgres(postgres_url) as url:
            await migrate(url, lock_timeout=30)
            engine = create_engine(url)
            try:
                yield Store(backend, url, engine)
            finally:
                await engine.dispose()
    else:
        raise ValueError(f"unknown backend {backend!r}")


async def add_tenant(engine: AsyncEngine) -> tuple[str, str]:
    """A workspace and a principal; `(workspace_id, principal_id)`."""
    workspace_id, principal_id = new_id("wsp"), new_id("key")
    async with engine.begin() as conn:
        await conn.execute(insert(workspaces).values(id=workspace_id, name=workspace_id, created_at=db_now()))
        await conn.execute(
            insert(principals).values(
                id=principal_id,
                workspace_id=workspace_id,
                name="bench",
                secret_hash=secrets.token_hex(32),
                permissions=["read", "run", "admin"],
                created_at=db_now(),
            )
        )
    return workspace_id, principal_id


async def add_thread_run(engine: AsyncEngine, workspace_id: str, principal_id: str, agent: str) -> tuple[str, str]:
    """A thread and an `accepted`, due run on it (what a submission creates); `(thread_id, run_id)`."""
    thread_id, run_id = new_id("thr"), new_id("run")
    async with engine.begin() as conn:
        await conn.execute(
            insert(threads).values(
                id=thread_id,
                workspace_id=workspace_id,
                origin="new",
                agent=agent,
                created_at=db_now(),
                updated_at=db_now(),
            )
        )
        await conn.execute(
            insert(runs).values(
                id=run_id,
                workspace_id=workspace_id,
                thread_id=thread_id,
                agent=agent,
                principal_id=principal_id,
                authority={"principal_id": principal_id, "permissions": ["read", "run", "admin"]},
                options={},
                options_digest="0" * 64,
                source_entry_id=None,
                trigger="input",
                lineage="root",
                status="accepted",
                available_at=db_now(),
                max_attempts=3,
                created_at=db_now(),
            )
        )
        await conn.execute(update(threads).where(threads.c.id == thread_id).values(current_run_id=run_id))
    return thread_id, run_id


async def claim(engine: AsyncEngine, agent: str, run_id: str, *, lease_seconds: float = 600.0) -> Lease:
    """Claim the one due run of `agent` (§7.2) and start its attempt (S-16); the attempt's lease."""
    claimed = await claim_runs(
        engine,
        worker_id="bench-worker",
        agents={agent},
        limit=1,
        lease_seconds=lease_seconds,
        randbytes=secrets.token_bytes,
    )
    if len(claimed) != 1 or claimed[0].lease.run_id != run_id:
        raise RuntimeError(f"expected to claim run {run_id}, got {[c.lease.run_id for c in claimed]}")
    lease = claimed[0].lease
    await start_attempt(engine, lease, harness_run_id="bench_" + secrets.token_hex(8))
    return lease


_STORED_BYTES = {
    # Payload columns of everything a run's checkpoints store: the new messages packed in each row (bodies, digests
    # and their length prefixes), message rows of checkpoints written before migration 0006 (bodies and digests),
    # envelopes and digests.
    "sqlite": text(
        "SELECT coalesce((SELECT sum(length(m.body) + length(m.digest)) FROM checkpoint_messages m"
        "  JOIN checkpoints c ON c.id = m.checkpoint_id WHERE c.thread_id = :thread), 0)"
        " + coalesce((SELECT sum(coalesce(length(c.envelope), 0) + length(c.envelope_digest)"
        "  + coalesce(length(c.messages), 0)) FROM checkpoints c WHERE c.thread_id = :thread), 0)"
    ),
    "postgresql": text(
        "SELECT coalesce((SELECT sum(octet_length(m.body) + octet_length(m.digest)) FROM checkpoint_messages m"
        "  JOIN checkpoints c ON c.id = m.checkpoint_id WHERE c.thread_id = :thread), 0)"
        " + coalesce((SELECT sum(coalesce(octet_length(c.envelope), 0) + octet_length(c.envelope_digest)"
        "  + coalesce(octet_length(c.messages), 0)) FROM checkpoints c WHERE c.thread_id = :thread), 0)"
    ),
}


async def stored_bytes(store: Store, thread_id: str) -> int:
    """Checkpoint payload bytes stored for a thread (messages with their digests, envelopes + digests), read by SQL."""
    async with store.engine.connect() as conn:
        return int((await conn.execute(_STORED_BYTES[store.backend], {"thread": thread_id})).scalar_one())


def peers_python() -> Path:
    return Path(__file__).resolve().parent / ".venv-peers" / "bin" / "python"


def run_json(command: list[str], *, timeout: float) -> tuple[dict[str, Any] | None, str]:
    """Run a command that prints one JSON object on its last stdout line; `(object or None, error text)`."""
    import json

    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        return None, f"exit status {proc.returncode}: {proc.stderr.strip()[-2000:]}"
    try:
        return json.loads(lines[-1]), ""
    except ValueError as exc:
        return None, f"unreadable output ({exc}): {lines[-1][:200]}"
