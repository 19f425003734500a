"""Migrations reproduce tables.py exactly, under a lock, on SQLite and PostgreSQL (S-122, S-123, STYLE habit 5)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa
from alembic import command
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from sqlalchemy.ext.asyncio import AsyncConnection

from candor.service.errors import SchemaMismatch, StoreUnavailable
from candor.service.store.attempts.seals import select_run_usage, sum_usage
from candor.service.store.checkpoints.incremental import (
    CheckpointEnvelope,
    encode_envelope,
    encode_history,
    insert_checkpoint,
    load_state,
)
from candor.service.store.db.dialect import MIGRATION_LOCK_KEY
from candor.service.store.db.engine import create_engine
from candor.service.store.schema.dialect import trigger_names
from candor.service.store.schema.migration import (
    alembic_config,
    check_schema,
    head_revision,
    migrate,
    require_current_schema,
)
from candor.service.store.schema.tables import GUARDS, metadata


async def _table_names(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda c: sa.inspect(c).get_table_names()))
    finally:
        await engine.dispose()


async def test_check_schema_reports_pending_and_changes_nothing(empty_db: str) -> None:
    """S-123: on an empty database the check reports pending migrations and creates nothing."""
    status = await check_schema(empty_db)
    assert status.current == ()
    assert status.head == head_revision()
    assert status.is_pending and not status.is_current
    assert status.differences
    assert await _table_names(empty_db) == set()
    with pytest.raises(SchemaMismatch) as caught:
        await require_current_schema(empty_db)
    assert caught.value.code == "schema_mismatch"


async def test_upgrade_head_reproduces_tables_exactly(empty_db: str) -> None:
    """STYLE habit 5, S-123: after `upgrade head`, compare_metadata against tables.py finds no differences."""
    applied = await migrate(empty_db)
    assert applied[0] == "0001" and applied[-1] == head_revision()
    status = await check_schema(empty_db)
    assert status.differences == ()
    assert status.is_current
    assert await _table_names(empty_db) == set(metadata.tables) | {"alembic_version"}
    assert await migrate(empty_db) == ()  # nothing left to apply


async def test_concurrent_migrations_apply_each_revision_once(empty_db: str) -> None:
    """S-122: two processes migrating at the same time apply each revision exactly once."""
    first, second = await asyncio.gather(migrate(empty_db), migrate(empty_db))
    assert sorted([first, second]) == [(), ("0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008")]
    assert head_revision() == "0008"
    assert (await check_schema(empty_db)).is_current


def _alembic_step(target: str, *, down: bool = False) -> Any:
    """Upgrade (or downgrade) to `target` on the connection `run_sync` passes."""

    def run(sync_conn: sa.Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = sync_conn
        (command.downgrade if down else command.upgrade)(config, target)

    return run


async def test_0002_records_declared_on_existing_runs(empty_db: str) -> None:
    """Issue 13 item 1: revision 0002 adds `runs.tool_recovery`; runs accepted before it read "declared" (the mode
    every run was hosted with until then), and downgrading to 0001 removes the column again."""
    engine = create_engine(empty_db)
    step = _alembic_step
    try:
        async with engine.begin() as conn:
            await conn.run_sync(step("0001"))
            # Only the columns 0001 knows; the runs insert trigger wants `accepted`.
            await conn.exec_driver_sql("INSERT INTO workspaces (id, name, created_at) VALUES ('ws_1', 'w', 0)")
            await conn.exec_driver_sql(
                "INSERT INTO threads (id, workspace_id, origin, agent, version, created_at, updated_at) "
                "VALUES ('thr_1', 'ws_1', 'new', 'a', 1, 0, 0)"
            )
            await conn.exec_driver_sql(
                "INSERT INTO runs (id, workspace_id, thread_id, agent, principal_id, authority, options, "
                "options_digest, trigger, lineage, status, available_at, attempts, max_attempts, checkpoint_seq, "
                "created_at, version) VALUES ('run_1', 'ws_1', 'thr_1', 'a', 'prn_1', '{}', '{}', 'd', 'input', "
                "'root', 'accepted', 0, 0, 3, 0, 0, 1)"
            )
            await conn.run_sync(step("0002"))
            mode = (await conn.exec_driver_sql("SELECT tool_recovery FROM runs WHERE id = 'run_1'")).scalar_one()
            assert mode == "declared"
            await conn.run_sync(step("0001", down=True))
            columns = await conn.run_sync(lambda c: {col["name"] for col in sa.inspect(c).get_columns("runs")})
            assert "tool_recovery" not in columns and "max_attempts" in columns
    finally:
        await engine.dispose()


async def test_0003_replaces_the_workspace_index_and_downgrades_cleanly(empty_db: str) -> None:
    """Revision 0003: `ix_runs_workspace_created` and `ix_runs_workspace_waiting` replace `ix_runs_workspace_id`;
    downgrading to 0002 restores it, and upgrading again leaves the schema exactly as tables.py has it."""

    def index_names(sync_conn: sa.Connection) -> set[str]:
        return {index["name"] for index in sa.inspect(sync_conn).get_indexes("runs") if index["name"]}

    await migrate(empty_db)
    engine = create_engine(empty_db)
    try:
        async with engine.begin() as conn:
            names = await conn.run_sync(index_names)
            assert {"ix_runs_workspace_created", "ix_runs_workspace_waiting"} <= names
            assert "ix_runs_workspace_id" not in names
            await conn.run_sync(_alembic_step("0002", down=True))
            names = await conn.run_sync(index_names)
            assert "ix_runs_workspace_id" in names and "ix_runs_workspace_created" not in names
            await conn.run_sync(_alembic_step("head"))
    finally:
        await engine.dispose()
    assert (await check_schema(empty_db)).differences == ()


async def test_0005_indexes_the_pointers_cleanup_follows_and_downgrades_cleanly(empty_db: str) -> None:
    """Revision 0005 (§9.6, S-47): `checkpoints.base_id`, `runs.start_checkpoint_id` and
    `threads.base_checkpoint_id` get the indexes checkpoint cleanup searches; downgrading to 0004 drops exactly
    those, and upgrading again leaves the schema as tables.py has it."""
    added = {
        ("checkpoints", "ix_checkpoints_base_id"),
        ("runs", "ix_runs_start_checkpoint_id"),
        ("threads", "ix_threads_base_checkpoint_id"),
    }

    def indexes(sync_conn: sa.Connection) -> set[tuple[str, str]]:
        inspector = sa.inspect(sync_conn)
        return {
            (table, index["name"])
            for table in ("checkpoints", "runs", "threads")
            for index in inspector.get_indexes(table)
            if index["name"]
        }

    await migrate(empty_db)
    engine = create_engine(empty_db)
    try:
        async with engine.begin() as conn:
            at_head = await conn.run_sync(indexes)
            assert added <= at_head
            await conn.run_sync(_alembic_step("0004", down=True))
            later = {("threads", "ix_threads_workspace_created")}  # revision 0006, dropped on the way down too
            assert await conn.run_sync(indexes) == at_head - added - later
            await conn.run_sync(_alembic_step("head"))
    finally:
        await engine.dispose()
    assert (await check_schema(empty_db)).differences == ()


async def test_0006_indexes_the_thread_list_and_downgrades_cleanly(empty_db: str) -> None:
    """Revision 0006 (S-98, S-123): `ix_threads_workspace_created` backs the keyset of `GET /v1/threads`;
    downgrading to 0005 drops exactly it, and upgrading again leaves the schema as tables.py has it."""

    def indexes(sync_conn: sa.Connection) -> set[str]:
        return {index["name"] for index in sa.inspect(sync_conn).get_indexes("threads") if index["name"]}

    await migrate(empty_db)
    engine = create_engine(empty_db)
    try:
        async with engine.begin() as conn:
            at_head = await conn.run_sync(indexes)
            assert "ix_threads_workspace_created" in at_head
            await conn.run_sync(_alembic_step("0005", down=True))
            assert await conn.run_sync(indexes) == at_head - {"ix_threads_workspace_created"}
            await conn.run_sync(_alembic_step("head"))
    finally:
        await engine.dispose()
    assert (await check_schema(empty_db)).differences == ()


async def _trigger_definitions(conn: AsyncConnection, schema: str | None = None) -> dict[str, str]:
    if conn.dialect.name == "sqlite":
        rows = await conn.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")
        return {row["name"]: row["sql"] for row in rows.mappings()}
    rows = await conn.execute(
        sa.text(
            "SELECT t.tgname, c.relname, t.tgtype, p.prosrc FROM pg_trigger t "
            "JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_proc p ON p.oid = t.tgfoid WHERE NOT t.tgisinternal AND n.nspname = :schema"
        ),
        {"schema": schema},
    )
    return {row["tgname"]: f"{row['relname']}:{row['tgtype']}:{row['prosrc']}" for row in rows.mappings()}


async def test_0004_drops_the_step_tables_workspace_keys_on_postgresql_only(empty_db: str) -> None:
    """Revision 0004 (issue 12, §7.8): on PostgreSQL `checkpoints`, `usage_records` and `stream_entries` lose their
    foreign keys to `workspaces`, and downgrading to 0003 restores them; SQLite keeps them. Either way the schema
    then equals tables.py's for that dialect."""

    def workspace_keys(sync_conn: sa.Connection) -> set[str]:
        inspector = sa.inspect(sync_conn)
        return {
            f"{table}.{key['name']}"
            for table in ("checkpoints", "usage_records", "stream_entries")
            for key in inspector.get_foreign_keys(table)
            if key["referred_table"] == "workspaces"
        }

    all_three = {f"{t}.fk_{t}_workspace_id" for t in ("checkpoints", "usage_records", "stream_entries")}
    await migrate(empty_db)
    engine = create_engine(empty_db)
    try:
        async with engine.begin() as conn:
            postgresql = conn.dialect.name == "postgresql"
            assert await conn.run_sync(workspace_keys) == (set() if postgresql else all_three)
            await conn.run_sync(_alembic_step("0003", down=True))
            assert await conn.run_sync(workspace_keys) == all_three
        # At 0003 the comparison with this build reports each key PostgreSQL should no longer have.
        reported = {d for d in (await check_schema(empty_db)).differences if d.startswith("remove_fk")}
        # (0007's keys of `checkpoints` to threads and runs are back at 0003 too, and reported the same way.)
        step_keys = {"checkpoints.fk_checkpoints_thread_id", "checkpoints.fk_checkpoints_run_id"}
        assert reported == ({f"remove_fk {key}" for key in all_three | step_keys} if postgresql else set())
        async with engine.begin() as conn:
            await conn.run_sync(_alembic_step("head"))
            assert await conn.run_sync(workspace_keys) == (set() if postgresql else all_three)
    finally:
        await engine.dispose()
    assert (await check_schema(empty_db)).differences == ()


async def test_migrated_triggers_equal_tables_triggers(db_kind: str, empty_db: str, tmp_path: object) -> None:
    """S-6…S-9: migration 0001 installs exactly the triggers tables.py creates through `create_all`."""
    await migrate(empty_db)
    engine = create_engine(empty_db)
    other = create_engine(f"sqlite:///{tmp_path}/create_all.db") if db_kind == "sqlite" else engine
    try:
        async with engine.begin() as conn:
            migrated = await _trigger_definitions(conn, "public")
        async with other.begin() as conn:
            if db_kind == "postgresql":
                await conn.exec_driver_sql("DROP SCHEMA IF EXISTS created CASCADE")
                await conn.exec_driver_sql("CREATE SCHEMA created")
                await conn.exec_driver_sql("SET LOCAL search_path TO created")
            await conn.run_sync(metadata.create_all)
            created = await _trigger_definitions(conn, "created")
            if db_kind == "postgresql":
                await conn.exec_driver_sql("DROP SCHEMA created CASCADE")
    finally:
        await engine.dispose()
        await other.dispose()
    assert set(migrated) == trigger_names(GUARDS, db_kind)  # type: ignore[arg-type]  # db_kind is a DialectName
    assert migrated == created


async def test_downgrade_to_base_removes_everything(empty_db: str) -> None:
    """Revision 0001 is reversible: downgrading to base leaves only Alembic's version table."""
    await migrate(empty_db)
    engine = create_engine(empty_db)
    try:
        async with engine.begin() as conn:

            def downgrade(sync_conn: sa.Connection) -> None:
                config = alembic_config()
                config.attributes["connection"] = sync_conn
                command.downgrade(config, "base")

            await conn.run_sync(downgrade)
    finally:
        await engine.dispose()
    assert await _table_names(empty_db) == {"alembic_version"}
    assert (await check_schema(empty_db)).current == ()


async def test_migration_waits_at_most_the_lock_timeout(db_kind: str, empty_db: str) -> None:
    """§10.3: while another process holds the migration lock, `migrate` gives up after its lock timeout."""
    if db_kind == "sqlite":
        holder = create_engine(empty_db)
        async with holder.connect() as conn:
            await conn.execution_options(candor_sqlite_begin="EXCLUSIVE")
            async with conn.begin():
                with pytest.raises(StoreUnavailable):
                    await migrate(empty_db, lock_timeout=0.3)
        await holder.dispose()
    else:
        conn = await asyncpg.connect(empty_db)
        try:
            await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
            with pytest.raises(StoreUnavailable):
                await migrate(empty_db, lock_timeout=0.3)
        finally:
            await conn.close()
    assert (await check_schema(empty_db)).current == ()


async def test_0007_keeps_message_rows_readable_next_to_packed_checkpoints(empty_db: str) -> None:
    """Revision 0007 (§6 amended, S-43, S-46): a checkpoint written before it, with one
    `checkpoint_messages` row per message and its usage in `usage_records`, still rebuilds after the upgrade, as does
    a packed checkpoint that extends it; its usage and the new row's are summed alike (§7.10). Downgrading to 0006
    and upgrading again leaves the schema as tables.py has it."""
    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(content="old")]),
        ModelResponse(parts=[TextPart(content="hi")]),
    ]
    encoded = encode_history(history)
    envelope = encode_envelope(CheckpointEnvelope(thread_id="thr_1"))
    engine = create_engine(empty_db)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_alembic_step("0006"))
            await conn.exec_driver_sql("INSERT INTO workspaces (id, name, created_at) VALUES ('ws_1', 'w', 0)")
            await conn.exec_driver_sql(
                "INSERT INTO threads (id, workspace_id, origin, agent, version, created_at, updated_at) "
                "VALUES ('thr_1', 'ws_1', 'new', 'a', 1, 0, 0)"
            )
            await conn.exec_driver_sql(
                "INSERT INTO runs (id, workspace_id, thread_id, agent, principal_id, authority, options, "
                "options_digest, trigger, lineage, status, available_at, attempts, max_attempts, checkpoint_seq, "
                "created_at, version, tool_recovery) VALUES ('run_1', 'ws_1', 'thr_1', 'a', 'prn_1', '{}', '{}', "
                "'d', 'input', 'root', 'accepted', 0, 0, 3, 0, 0, 1, 'declared')"
            )
            await conn.execute(
                sa.text(
                    "INSERT INTO checkpoints (id, workspace_id, thread_id, run_id, seq, attempt, format, base_id, "
                    "kept, count, envelope, envelope_digest, created_at) VALUES ('ckp_old', 'ws_1', 'thr_1', "
                    "'run_1', 1, 1, 1, NULL, 0, 2, :envelope, :digest, 0)"
                ),
                {"envelope": envelope.text, "digest": envelope.digest},
            )
            for index, message in enumerate(encoded):
                await conn.execute(
                    sa.text(
                        'INSERT INTO checkpoint_messages (checkpoint_id, "index", body, digest) '
                        "VALUES ('ckp_old', :index, :body, :digest)"
                    ),
                    {"index": index, "body": message.body, "digest": message.digest},
                )
            await conn.exec_driver_sql(
                "INSERT INTO usage_records (workspace_id, run_id, attempt_id, checkpoint_seq, usage, created_at) "
                """VALUES ('ws_1', 'run_1', 'att_1', 1, '{"requests": 1}', 0)"""
            )
            await conn.run_sync(_alembic_step("head"))
            grown = [*encoded, *encode_history([ModelRequest(parts=[UserPromptPart(content="new")])])]
            written = await insert_checkpoint(
                conn,
                thread_id="thr_1",
                run_id="run_1",
                seq=2,
                attempt=1,
                base_id="ckp_old",
                base_encoded=encoded,
                new_encoded=grown,
                envelope=envelope,
                checkpoint_id="ckp_new",
            )
            assert (written.kept, written.count) == (2, 3)
            await conn.execute(sa.text("""UPDATE checkpoints SET usage = '{"requests": 2}' WHERE id = 'ckp_new'"""))
            assert (await load_state(conn, "ckp_old")).encoded == encoded
            assert (await load_state(conn, "ckp_new")).encoded == grown
            usage = sum_usage(row.usage for row in (await conn.execute(select_run_usage("run_1"))).all())
            assert usage["requests"] == 3
        async with engine.begin() as conn:
            await conn.execute(sa.text("DELETE FROM checkpoints WHERE id = 'ckp_new'"))
            await conn.run_sync(_alembic_step("0006", down=True))
            await conn.run_sync(_alembic_step("head"))
    finally:
        await engine.dispose()
    assert (await check_schema(empty_db)).differences == ()
