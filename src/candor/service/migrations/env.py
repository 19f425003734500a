"""Alembic environment for the service schema.

store/schema/migration.py runs Alembic programmatically and hands over an open connection (already inside a transaction
that holds the migration lock) as `config.attributes["connection"]`. Without one (the `alembic` command line with
`sqlalchemy.url` set), it opens an async engine itself; offline mode renders SQL.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from candor.service.store.db import create_engine
from candor.service.store.schema import include_name, include_object_for, metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        include_name=include_name,
        include_object=include_object_for(connection.dialect.name),
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
        on_version_apply=config.attributes.get("on_version_apply"),
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async(url: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


def _main() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if context.is_offline_mode():
        context.configure(url=url, target_metadata=metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    if not url:
        raise RuntimeError("set sqlalchemy.url or pass a connection in config.attributes['connection']")
    asyncio.run(_run_async(url))


_main()
