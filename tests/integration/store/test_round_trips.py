"""The fenced write path in few round trips (§7.3, §7.8): a checkpoint commit is a fixed, small number of statements
whatever the history length, and the one-statement fence still reads the clock only after its locks."""

from __future__ import annotations

import asyncio
import re
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage
from sqlalchemy import event, func, select, text, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine.interfaces import CacheStats
from sqlalchemy.ext.asyncio import AsyncEngine

from candor.service.errors import LeaseLost, StoreUnavailable
from candor.service.store.attempts.seals import commit_checkpoint
from candor.service.store.attempts.step_commit import render_postgresql
from candor.service.store.checkpoints.incremental import CheckpointEnvelope, encode_envelope, encode_history, load_state
from candor.service.store.db.engine import create_engine, read_transaction, write_transaction
from candor.service.store.db.pg_driver import pooled_asyncpg
from candor.service.store.reads.views import select_run
from candor.service.store.runs.claims import lock_attempt
from candor.service.store.schema.dialect import allocate_stream_ids, db_now
from candor.service.store.schema.tables import (
    checkpoint_messages,
    checkpoints,
    inbox_entries,
    run_attempts,
    runs,
    stream_entries,
    threads,
    usage_records,
)
from candor.service.store.threads.streams import NewStreamEntry

from .step_commits import (
    commit_twice_and_once_refused,
    first_commit,
    first_commit_in_background,
    leased_run,
    stored_checkpoints,
)
from .test_checkpoints import prompt, step
from transactions import sent_in_transactions_on_driver
from waiting import wait_until

COMMIT_STATEMENTS = {"postgresql": 1, "sqlite": 1}
"""A plain step (store/attempts/step_commit.py) is one INSERT on both backends: the checkpoint row, its new messages packed in
it and its usage, selected from the fence (attempt and run) and, on PostgreSQL, the step's stream entries as CTEs of
the same statement (none here). On SQLite, without stream entries, the INSERT commits on its own."""


@contextmanager
def statements(engine: AsyncEngine) -> Iterator[list[tuple[str, CacheStats]]]:
    """The SQL statements `engine` sends inside the block, each with whether SQLAlchemy found it compiled in its
    cache; SQLite's `BEGIN IMMEDIATE` is left out (on PostgreSQL the driver sends BEGIN and COMMIT itself, so
    neither backend counts them)."""
    sent: list[tuple[str, CacheStats]] = []

    def record(_conn: Any, _cursor: Any, statement: str, _params: Any, context: Any, _many: bool) -> None:
        if not statement.lstrip().upper().startswith("BEGIN"):
            sent.append((statement, context.cache_hit))

    def record_on_driver(_driver: Any, statement: str) -> None:
        sent.append((statement, CacheStats.CACHE_HIT))  # compiled once (`statements.fetch_rows`)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        with sent_in_transactions_on_driver(record_on_driver):
            yield sent
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


@asynccontextmanager
async def driver_statements(engine: AsyncEngine) -> AsyncIterator[list[str]]:
    """The SQL statements `engine`'s connections send inside the block, as the driver sees them: asyncpg's query log
    (its type introspection, once per connection, left out) or SQLite's trace callback. A plain step commit runs on the
    driver directly on PostgreSQL (`store/attempts/step_commit.py`), so SQLAlchemy's events (`statements`) do not see it.
    BEGIN, COMMIT and ROLLBACK are left out (PostgreSQL's step commit has none: it is one statement).
    Only connections checked out inside the block are observed. asyncpg hands its log to the loggers on the event
    loop's next turn (`call_soon`), so the block ends with one."""
    sent: list[str] = []

    def record(text: str) -> None:
        introspection = "pg_catalog" in text or "set_config('jit'" in text
        if not introspection and not text.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            sent.append(text)

    def traced(text: str) -> None:
        # SQLite traces each execution with its values filled in (an executemany row by row, an UPDATE again for
        # its trigger): one entry per statement, its text up to the first value.
        statement = re.split(r"'|\bVALUES\b|=", text, maxsplit=1)[0].strip()
        if not sent or sent[-1] != statement:
            record(statement)

    def logged(query: Any) -> None:
        record(query.query)

    def checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if postgresql:
            dbapi_connection.driver_connection.add_query_logger(logged)
        else:
            dbapi_connection.driver_connection._conn.set_trace_callback(traced)

    def checkin(dbapi_connection: Any, _record: Any) -> None:
        if dbapi_connection is None:
            return
        if postgresql:
            dbapi_connection.driver_connection.remove_query_logger(logged)
        else:
            dbapi_connection.driver_connection._conn.set_trace_callback(None)

    postgresql = engine.dialect.name == "postgresql"
    event.listen(engine.sync_engine.pool, "checkout", checkout)
    event.listen(engine.sync_engine.pool, "checkin", checkin)
    try:
        yield sent
        await asyncio.sleep(0)  # the queries logged inside the block reach `logged`
    finally:
        event.remove(engine.sync_engine.pool, "checkout", checkout)
        event.remove(engine.sync_engine.pool, "checkin", checkin)


@pytest.mark.parametrize("steps_before", [1, 40])
async def test_a_commit_is_a_fixed_number_of_statements(db: Any, steps_before: int) -> None:
    """S-37, S-41, S-20: a plain step commit with usage sends exactly `COMMIT_STATEMENTS` statements (one INSERT),
    writes no row but its checkpoint (no message rows, no usage record, `runs` untouched, S-37), at a short and at a long history alike, the same ones again at the next commit of the same shape
    (constants the driver keeps prepared), and writes what it always wrote. A regression in round trips (or in
    compilation work) per durable step fails here."""
    lease = await leased_run(db)
    envelope = encode_envelope(CheckpointEnvelope(thread_id=lease.thread_id))
    history: list[ModelMessage] = [prompt("go")]
    for number in range(1, steps_before + 1):
        history += step(number)
    base = encode_history(history)
    first = await first_commit(
        db.engine,
        lease,
        new_encoded=base,
        envelope=envelope,
        source_entry_consumed=True,
        usage={"requests": 1},
    )
    grown = [*base, *encode_history(step(steps_before + 1))]
    async with driver_statements(db.engine) as sent:
        second = await commit_checkpoint(
            db.engine,
            lease,
            expected_seq=1,
            base_id=first.checkpoint_id,
            base_encoded=base,
            new_encoded=grown,
            envelope=envelope,
            usage={"requests": 1},
        )
    assert len(sent) == COMMIT_STATEMENTS[db.kind], "\n".join(statement[:50] for statement in sent)
    further = [*grown, *encode_history(step(steps_before + 2))]
    async with driver_statements(db.engine) as again:  # same shape: the same constant statements
        third = await commit_checkpoint(
            db.engine,
            lease,
            expected_seq=2,
            base_id=second.checkpoint_id,
            base_encoded=grown,
            new_encoded=further,
            envelope=envelope,
            usage={"requests": 1},
        )
    assert again == sent, again  # the same constant statements, prepared once per connection by the driver
    assert sent[0].lstrip().upper().startswith(("INSERT", "WITH")), sent
    assert (second.kept, second.count) == (len(base), len(grown))
    async with read_transaction(db.engine) as conn:
        stored = select(runs.c.checkpoint_id, runs.c.checkpoint_seq).where(runs.c.id == lease.run_id)
        assert tuple((await conn.execute(stored)).one()) == (first.checkpoint_id, 1)  # plain steps leave `runs`
        view = (await conn.execute(select_run(workspace_id=None, run_id=lease.run_id))).mappings().one()
        assert (view["checkpoint_id"], view["checkpoint_seq"]) == (third.checkpoint_id, 3)  # derived while running
        rows = select(func.count()).select_from(checkpoint_messages)
        assert (await conn.execute(rows)).scalar_one() == 0  # new messages are packed in the checkpoint row
        assert (await conn.execute(select(func.count()).select_from(usage_records))).scalar_one() == 0
        usage = select(checkpoints.c.seq, checkpoints.c.usage, checkpoints.c.attempt)
        recorded = (await conn.execute(usage.where(checkpoints.c.run_id == lease.run_id))).all()
        assert sorted(tuple(row) for row in recorded) == [(seq, {"requests": 1}, 1) for seq in (1, 2, 3)]
        assert (await load_state(conn, second.checkpoint_id)).encoded == grown
        assert (await load_state(conn, third.checkpoint_id)).encoded == further


@pytest.mark.parametrize("db_kind", [pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_postgresql_plans_the_step_statement_once_per_connection(db: Any) -> None:
    """S-37: the step commit's statement is prepared per connection and, after PostgreSQL's five trial custom plans,
    runs on its generic plan. Its generic plan must not look dearer than a custom one: when a set-returning function
    over a parameter made it so (`generate_series(1, cardinality($16))`, estimated at 1,000 rows), PostgreSQL planned
    the statement afresh at every commit, about 1 ms of server CPU each, twice per durable step (issue 12)."""
    engine = create_engine(db.url, pool_size=1, max_overflow=0)  # every commit on the same connection
    try:
        lease = await leased_run(db)
        envelope = encode_envelope(CheckpointEnvelope(thread_id=lease.thread_id))
        history: list[ModelMessage] = [prompt("go")]
        previous = await first_commit(
            engine,
            lease,
            new_encoded=encode_history(history),
            envelope=envelope,
            source_entry_consumed=True,
        )
        for number in range(1, 9):
            grown = [*history, *step(number)]
            previous = await commit_checkpoint(
                engine,
                lease,
                expected_seq=number,
                base_id=previous.checkpoint_id,
                base_encoded=encode_history(history),
                new_encoded=encode_history(grown),
                envelope=envelope,
                usage={"requests": 1},
            )
            history = grown
        plans = await _plans(engine, render_postgresql()[0])
    finally:
        await engine.dispose()
    assert plans == {"custom_plans": 5, "generic_plans": 3}  # the first commit (source entry) is not a plain step


@pytest.mark.parametrize("db_kind", [pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_postgresql_plans_the_stream_id_allocation_once_per_connection(db: Any) -> None:
    """S-37: the general commit path's stream id allocation (every seal, every commit that incorporates steer
    entries) goes generic after five custom plans too; over `generate_series(1, :count)` it never did."""
    engine = create_engine(db.url, pool_size=1, max_overflow=0)
    try:
        lease = await leased_run(db)
        for count in range(1, 10):
            async with write_transaction(engine) as conn:
                last, ids = await allocate_stream_ids(conn, lease.thread_id, count)
                assert last is None and len(ids) == count and ids == sorted(ids)
        plans = await _plans(engine, "SELECT nextval(pg_get_serial_sequence(%")
    finally:
        await engine.dispose()
    assert plans == {"custom_plans": 5, "generic_plans": 4}


async def _plans(engine: AsyncEngine, statement: str) -> dict[str, int] | None:
    """How often PostgreSQL planned the prepared `statement` (a LIKE pattern) on `engine`'s one connection."""
    async with engine.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None
        row = await driver.fetchrow(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE $1", statement
        )
    return None if row is None else dict(row)


async def test_the_fence_reads_the_clock_after_waiting_for_its_locks(db: Any) -> None:
    """S-20, §7.3: the fence locks thread → run → attempt and only then reads "now". A commit that waited for the
    attempt's row lock past the lease's expiry raises `LeaseLost` and writes nothing, although the lease was
    still valid when the commit started."""
    lease = await leased_run(db)
    async with write_transaction(db.engine) as conn:  # moving an expiry earlier is allowed (S-9)
        await conn.execute(
            update(run_attempts).where(run_attempts.c.id == lease.attempt_id).values(lease_expires_at=db_now() + 0.3)
        )
    envelope = encode_envelope(CheckpointEnvelope(thread_id=lease.thread_id))
    async with write_transaction(db.engine) as holder:  # SQLite: the writer lock; PostgreSQL: the attempt row
        await holder.execute(lock_attempt(lease.attempt_id))
        commit = asyncio.ensure_future(
            first_commit(
                db.engine,
                lease,
                new_encoded=(),
                envelope=envelope,
            )
        )

        async def lease_expired() -> bool:  # read on another connection: the holder keeps the commit waiting
            async with read_transaction(db.engine) as reader:
                query = select(run_attempts.c.lease_expires_at < db_now()).where(run_attempts.c.id == lease.attempt_id)
                return bool((await reader.execute(query)).scalar_one())

        await wait_until(lease_expired, 10)
        assert not commit.done()
    with pytest.raises(LeaseLost):
        await commit
    async with read_transaction(db.engine) as conn:
        assert (await conn.execute(select(runs.c.checkpoint_seq).where(runs.c.id == lease.run_id))).scalar_one() == 0
        assert (await conn.execute(select(func.count()).select_from(checkpoints))).scalar_one() == 0


async def test_a_runs_first_commit_consumes_its_source_entry_in_the_same_transaction(db: Any) -> None:
    """§7.8 step 4, §8.5, S-76, S-75, S-37: the first commit of a run incorporates its source entry, so it is not a
    plain step and takes the general path: the source entry (the message that started the run, assigned to it)
    becomes `consumed` at seq 1, the thread's version goes up by one and the run's pointer moves, in the
    checkpoint's own transaction."""
    lease = await leased_run(db, source_entry=True)
    async with read_transaction(db.engine) as conn:
        version = select(threads.c.version).where(threads.c.id == lease.thread_id)
        before = (await conn.execute(version)).scalar_one()
    first = await first_commit(
        db.engine,
        lease,
        source_entry_consumed=True,
        usage={"requests": 1},
    )
    assert first.seq == 1
    async with read_transaction(db.engine) as conn:
        entry = select(inbox_entries.c.status, inbox_entries.c.incorporated_checkpoint_seq, inbox_entries.c.finished_at)
        status, seq, finished_at = (await conn.execute(entry.where(inbox_entries.c.thread_id == lease.thread_id))).one()
        assert (status, seq) == ("consumed", 1) and finished_at is not None
        assert (await conn.execute(version)).scalar_one() == before + 1
        stored = select(runs.c.checkpoint_id, runs.c.checkpoint_seq).where(runs.c.id == lease.run_id)
        assert tuple((await conn.execute(stored)).one()) == (first.checkpoint_id, 1)


async def test_a_long_first_commit_is_written_in_bounded_statements(db: Any) -> None:
    """S-41, S-43: a first commit of a long history (more message rows than one multi-row INSERT takes) stores
    every message once and rebuilds exactly."""
    lease = await leased_run(db)
    history: list[ModelMessage] = [prompt("go")]
    for number in range(1, 601):
        history += step(number)
    encoded = encode_history(history)
    committed = await first_commit(
        db.engine,
        lease,
        new_encoded=encoded,
        usage={"requests": 1},
    )
    assert (committed.kept, committed.count) == (0, 1201)
    async with read_transaction(db.engine) as conn:
        assert (await load_state(conn, committed.checkpoint_id)).encoded == encoded


@pytest.mark.parametrize("db_kind", [pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_a_step_commit_hands_its_connection_back_to_the_pool(db: Any) -> None:
    """S-37, S-20: the step commit checks its connection out of the pool and returns it itself (`pooled_asyncpg`),
    after a commit and after a fence that refused one alike: on a pool of one connection the next commit gets it.
    Returned, not collected: a connection the garbage collector hands back would pass the pool counts, but SQLAlchemy
    warns about it."""
    engine = create_engine(db.url, pool_size=1, max_overflow=0, timeout=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", sa_exc.SAWarning)
        try:
            await commit_twice_and_once_refused(db, engine)
        finally:
            await engine.dispose()
    assert not [w for w in caught if issubclass(w.category, sa_exc.SAWarning)], [str(w.message) for w in caught]


@pytest.mark.parametrize("db_kind", [pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_a_cancelled_step_commit_is_all_or_nothing_and_frees_its_connection(db: Any) -> None:
    """S-37, S-38: a step commit cancelled while its statement waits for a lock (a worker told to stop mid-commit)
    has an outcome the caller cannot know: asyncpg asks the server to cancel the statement, but the lock may be
    released first and the statement commit. Either way it is all or nothing (a checkpoint row exactly when the run
    points at it), its connection goes back to the pool, and the next commit on a pool of one connection, with the
    `checkpoint_seq` read back, succeeds."""
    engine = create_engine(db.url, pool_size=1, max_overflow=0, timeout=5)
    try:
        lease = await leased_run(db)
        envelope = encode_envelope(CheckpointEnvelope(thread_id=lease.thread_id))
        history = encode_history([prompt("go")])
        async with write_transaction(db.engine) as holder:  # the attempt's row lock keeps the statement waiting
            await holder.execute(lock_attempt(lease.attempt_id))
            commit = first_commit_in_background(engine, lease, history, envelope)
            await asyncio.sleep(0.3)
            assert not commit.done()
            commit.cancel()
            with pytest.raises(asyncio.CancelledError):
                await commit
        assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]  # QueuePool's, not on Pool

        async def statement_ended() -> bool:  # at the server: cancelled, or committed once the lock was free
            async with read_transaction(db.engine) as conn:
                return bool((await conn.execute(_OTHER_ACTIVE_BACKENDS)).scalar_one() == 0)

        await wait_until(statement_ended, 10)
        count, seq = await stored_checkpoints(db.engine, lease.run_id)
        assert (count, seq) in ((0, 0), (1, 1))  # nothing, or the whole commit
        committed = await asyncio.wait_for(
            commit_checkpoint(
                engine, lease, expected_seq=seq, base_id=None, base_encoded=(), new_encoded=history, envelope=envelope
            ),
            timeout=10,
        )
        assert committed.seq == seq + 1
        assert await stored_checkpoints(db.engine, lease.run_id) == (count + 1, seq + 1)
    finally:
        await engine.dispose()


_OTHER_ACTIVE_BACKENDS = text(
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid() "
    "AND backend_type = 'client backend'"  # not an autovacuum worker of the same database
)


async def test_a_step_connection_from_an_unreachable_server_is_unavailable() -> None:
    """§2.2: a refused connection at the step commit's checkout surfaces as `StoreUnavailable`, as it does for
    every other transaction, never as a driver or socket exception."""
    engine = create_engine("postgresql://postgres@127.0.0.1:1/none", timeout=1)
    try:
        with pytest.raises(StoreUnavailable):
            async with pooled_asyncpg(engine):
                pass
    finally:
        await engine.dispose()


@pytest.mark.parametrize("db_kind", [pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_a_step_commit_locks_only_its_attempt_row(db: Any) -> None:
    """§7.8, S-37 (issues 12, 33): a plain step writes its checkpoint row (usage on it) and its stream entries, and
    locks its attempt's row (`FOR SHARE`: what ends an attempt must wait for it, step_commit.py), but neither the
    workspace's, the thread's nor the run's row: foreign keys to them made PostgreSQL lock them `FOR KEY SHARE` at
    every commit (migrations 0004 and 0007 dropped those keys), and the old fence locked thread and run too. A lock
    leaves the locking transaction's id in the row's `xmax`, so those rows must come out with the `xmax` they had,
    and `runs` is not updated either (S-37)."""
    lease = await leased_run(db)
    workspace_xmax = text(
        "SELECT w.xmax::text, t.xmax::text, r.xmax::text, r.ctid::text FROM workspaces w "
        "JOIN threads t ON t.workspace_id = w.id JOIN runs r ON r.thread_id = t.id WHERE t.id = :thread"
    )
    async with read_transaction(db.engine) as conn:
        before = tuple((await conn.execute(workspace_xmax, {"thread": lease.thread_id})).one())
    committed = await first_commit(
        db.engine,
        lease,
        new_encoded=encode_history([prompt("go"), *step(1)]),
        usage={"requests": 1},
        stream_entries=[NewStreamEntry(type="delta", sequence=1, event={"event_kind": "part_start"})],
        boundary_sequence=2,
    )
    async with read_transaction(db.engine) as conn:
        after = tuple((await conn.execute(workspace_xmax, {"thread": lease.thread_id})).one())
        written = (
            await conn.execute(
                select(
                    select(func.count()).where(usage_records.c.run_id == lease.run_id).scalar_subquery(),
                    select(func.count()).where(stream_entries.c.run_id == lease.run_id).scalar_subquery(),
                )
            )
        ).one()
    assert committed.seq == 1 and tuple(written) == (0, 2)  # the usage rides on the checkpoint row
    # The workspace and run rows are untouched; the thread's is locked `FOR KEY SHARE` by the stream entries'
    # foreign key only (a step without stream entries leaves it alone too, next test).
    assert (after[0], after[2], after[3]) == (before[0], before[2], before[3])


@pytest.mark.parametrize("db_kind", [pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_plain_step_without_stream_entries_locks_no_thread_run_or_workspace_row(db: Any) -> None:
    """§7.8, S-37 (issue 33): a plain step with no stream entry writes one row and locks its attempt's row only: the
    workspace's, thread's and run's rows keep their `xmax` and the run its tuple (`ctid`: no update of `runs`)."""
    lease = await leased_run(db)
    rows = text(
        "SELECT w.xmax::text, t.xmax::text, r.xmax::text, r.ctid::text FROM workspaces w "
        "JOIN threads t ON t.workspace_id = w.id JOIN runs r ON r.thread_id = t.id WHERE t.id = :thread"
    )
    async with read_transaction(db.engine) as conn:
        before = tuple((await conn.execute(rows, {"thread": lease.thread_id})).one())
    committed = await first_commit(
        db.engine,
        lease,
        new_encoded=encode_history([prompt("go"), *step(1)]),
        usage={"requests": 1},
    )
    async with read_transaction(db.engine) as conn:
        after = tuple((await conn.execute(rows, {"thread": lease.thread_id})).one())
    assert committed.seq == 1
    assert after == before
