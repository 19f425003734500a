"""The writers of one process take turns on a SQLite engine before they ask SQLite for its writer lock
(`store/db/writer_gate.py`, issue 12): a queued writer waits on the event loop, in order, instead of sleeping in
SQLite's busy handler; it is bounded by `database.timeout`; PostgreSQL engines have no turns.

§2.2: SQLite's single writer lock stays what serializes writes; these tests check the queue in front of it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select

from candor.service.errors import StoreUnavailable
from candor.service.store.db.engine import create_engine, read_transaction, write_transaction
from candor.service.store.db.writer_gate import WriterGate, writer_turn
from candor.service.store.schema.tables import checkpoints, workspaces

from .rows import add_workspace
from .step_commits import first_commit, leased_run


async def _until(condition: Any) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.002)
    raise AssertionError("condition not reached")


def _gate(engine: Any) -> WriterGate:
    gate = writer_turn(engine)
    assert isinstance(gate, WriterGate)
    return gate


async def _write(
    engine: Any, *, until: asyncio.Event | None = None, done: list[str] | None = None, name: str = ""
) -> None:
    """One write transaction adding a workspace; held open until `until` is set; `name` appended to `done` after it
    committed."""
    async with write_transaction(engine) as conn:
        await add_workspace(conn)
        if until is not None:
            await until.wait()
    if done is not None:
        done.append(name)


async def _holding(engine: Any, release: asyncio.Event) -> asyncio.Task[None]:
    """A write transaction that has its turn and holds it until `release` is set."""
    holder = asyncio.create_task(_write(engine, until=release))
    await _until(lambda: _gate(engine).locked)
    return holder


async def _workspaces(engine: Any) -> int:
    async with read_transaction(engine) as conn:
        return int((await conn.execute(select(func.count()).select_from(workspaces))).scalar_one())


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_a_second_writer_waits_its_turn_and_goes_in_order(db: Any) -> None:
    """While one write transaction is open, the next ones of the process queue at the gate (none has asked SQLite
    for the lock, so none sleeps in its busy handler); each goes, in the order it came, once the one before it
    committed, and all of them commit."""
    order: list[str] = []
    gate, release = _gate(db.engine), asyncio.Event()
    holder = asyncio.create_task(_write(db.engine, until=release, done=order, name="first"))
    await _until(lambda: gate.locked)
    followers = [asyncio.create_task(_write(db.engine, done=order, name=name)) for name in ("second", "third")]
    await _until(lambda: gate.waiting == 2)
    assert db.engine.sync_engine.pool.checkedout() == 1  # only the holder's connection: the others queue first
    release.set()
    await asyncio.gather(holder, *followers)
    assert order == ["first", "second", "third"]
    assert await _workspaces(db.engine) == 3


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_a_step_commit_takes_its_turn_like_any_writer(db: Any) -> None:
    """§7.8, S-37: the step commit, which runs whole in the connection's thread, queues at the same gate as the
    other writes, and commits once the write before it is done."""
    lease = await leased_run(db)
    release = asyncio.Event()
    holder = await _holding(db.engine, release)
    commit = asyncio.create_task(
        first_commit(
            db.engine,
            lease,
        )
    )
    await _until(lambda: _gate(db.engine).waiting == 1)
    assert not commit.done()
    release.set()
    await holder
    written = await commit
    async with read_transaction(db.engine) as conn:
        stored = (await conn.execute(select(checkpoints.c.id).where(checkpoints.c.run_id == lease.run_id))).all()
    assert [row.id for row in stored] == [written.checkpoint_id]


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_a_turn_is_waited_for_at_most_the_database_timeout(db: Any) -> None:
    """A write transaction opened inside another on one task would wait for its own turn forever; after
    `database.timeout` it is `StoreUnavailable` (503 `unavailable`, as a busy SQLite), and the outer one still
    commits."""
    engine = create_engine(db.url, timeout=0.2)
    try:
        async with write_transaction(engine) as outer:
            await add_workspace(outer)
            with pytest.raises(StoreUnavailable) as caught:
                async with write_transaction(engine):
                    pass
            assert "database.timeout" in str(caught.value)
        assert await _workspaces(engine) == 1
    finally:
        await engine.dispose()


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_a_cancelled_waiter_leaves_the_queue(db: Any) -> None:
    """A writer cancelled while it waits for its turn (a request whose client went away) leaves the queue without
    taking a turn; the writers behind it still go."""
    release = asyncio.Event()
    holder = await _holding(db.engine, release)
    cancelled, behind = asyncio.create_task(_write(db.engine)), asyncio.create_task(_write(db.engine))
    await _until(lambda: _gate(db.engine).waiting == 2)
    cancelled.cancel()
    release.set()
    await asyncio.gather(holder, behind)
    assert cancelled.cancelled() and not _gate(db.engine).locked
    assert await _workspaces(db.engine) == 2


def test_an_engine_serves_one_event_loop_after_another(tmp_path: Any) -> None:
    """The gate's lock belongs to the loop it is used on; an engine used by one `asyncio.run` after another (a CLI
    command, a test) gets a fresh one."""
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}")

    async def write() -> None:
        async with write_transaction(engine) as conn:
            await conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
            await conn.exec_driver_sql("INSERT INTO t VALUES (1)")

    try:
        asyncio.run(write())
        asyncio.run(write())
    finally:
        asyncio.run(engine.dispose())


@pytest.mark.postgres
@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_postgresql_writers_take_no_turns(db: Any) -> None:
    """PostgreSQL locks rows, not the database: two write transactions of one process are open at once."""
    assert not isinstance(writer_turn(db.engine), WriterGate)
    both_open, release = asyncio.Event(), asyncio.Event()
    opened = 0

    async def write() -> None:
        nonlocal opened
        async with write_transaction(db.engine) as conn:
            await add_workspace(conn)
            opened += 1
            if opened == 2:
                both_open.set()
            await release.wait()

    tasks = [asyncio.create_task(write()) for _ in range(2)]
    await asyncio.wait_for(both_open.wait(), 10)
    release.set()
    await asyncio.gather(*tasks)


def _wait_metric() -> tuple[float, float]:
    count = REGISTRY.get_sample_value("candor_sqlite_writer_wait_seconds_count") or 0.0
    return count, REGISTRY.get_sample_value("candor_sqlite_writer_wait_seconds_sum") or 0.0


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_the_wait_for_a_turn_is_measured(db: Any) -> None:
    """`candor_sqlite_writer_wait_seconds` (docs/operations.md) observes every write's wait for its turn: a writer
    queued behind one that holds its turn for 0.1 s waited at least that long."""
    count_before, sum_before = _wait_metric()
    release = asyncio.Event()
    holder = await _holding(db.engine, release)
    asyncio.get_running_loop().call_later(0.1, release.set)
    await _write(db.engine)
    await holder
    count_after, sum_after = _wait_metric()
    assert count_after - count_before == 2
    assert sum_after - sum_before >= 0.09
