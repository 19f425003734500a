"""Schema migrations (§10.3): apply Alembic revisions under the migration lock, and check a schema against the build.

Alembic is configured in code (`alembic_config()`); no alembic.ini is read. `migrate()` applies pending revisions
inside one transaction that first takes the migration lock (PostgreSQL advisory lock, SQLite `BEGIN EXCLUSIVE`),
so control processes starting together apply each revision exactly once (S-122). `check_schema()` changes nothing:
it compares the stored revision with the build's head, the live schema with tables.py (`compare_metadata`) and the
triggers with the ones tables.py declares (S-123, `candor migrate --check`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from ... import migrations as _migrations_package
from ...errors import SchemaMismatch
from ..db.dialect import BEGIN_OPTION, acquire_migration_lock, dialect_name
from ..db.engine import DEFAULT_TIMEOUT, create_engine, read_transaction, translate_errors
from .dialect import existing_trigger_names, trigger_names
from .tables import GUARDS, metadata

__all__ = (
    "SchemaStatus",
    "migrate",
    "check_schema",
    "current_revisions",
    "require_current_schema",
    "alembic_config",
    "head_revision",
    "include_name",
    "DEFAULT_LOCK_TIMEOUT",
)

DEFAULT_LOCK_TIMEOUT = 900.0
"""`database.migration_lock_timeout` default (seconds)."""

MIGRATIONS_DIR = Path(_migrations_package.__file__).resolve().parent
VERSION_TABLE = "alembic_version"


@dataclass(frozen=True, kw_only=True, slots=True)
class SchemaStatus:
    """What `check_schema()` found."""

    current: tuple[str, ...]
    """Revisions recorded in the database (empty for a database never migrated)."""
    head: str
    """The build's head revision."""
    differences: tuple[str, ...]
    """Schema differences against tables.py (tables, columns, indexes, constraints, triggers), described."""

    @property
    def is_pending(self) -> bool:
        """Migrations are pending: the database is not at the build's head revision."""
        return self.current != (self.head,)

    @property
    def is_current(self) -> bool:
        """The schema is exactly the build's: head revision and no differences."""
        return not self.is_pending and not self.differences


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Alembic filter: compare everything except Alembic's own version table."""
    return not (type_ == "table" and name == VERSION_TABLE)


def include_object_for(dialect: str) -> Callable[[Any, str | None, str, bool, Any], bool]:
    """Alembic filter: a constraint of tables.py declared for some dialects only (`info["dialects"]`, created
    through `ddl_if`) is not missing on the others. (Alembic matches a declared constraint with a reflected one
    before it filters, so one present where it should not be is found by `_unwanted_foreign_keys` instead.)"""

    def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        dialects = None if reflected else getattr(obj, "info", {}).get("dialects")
        return dialects is None or dialect in dialects

    return include_object


def _unwanted_foreign_keys(connection: Connection) -> list[str]:
    """Foreign keys of tables.py declared for other dialects only, yet present in the database."""
    dialect = connection.dialect.name
    inspector = inspect(connection)
    existing = set(inspector.get_table_names())
    unwanted = []
    for table in (table for table in metadata.sorted_tables if table.name in existing):
        limited = {
            str(key.name)
            for key in table.foreign_key_constraints
            if key.info.get("dialects") is not None and dialect not in key.info["dialects"]
        }
        if limited:
            present = {key["name"] for key in inspector.get_foreign_keys(table.name)}
            unwanted += [f"remove_fk {table.name}.{name}" for name in sorted(limited & present)]
    return unwanted


def alembic_config(url: str | URL | None = None) -> Config:
    """An Alembic `Config` pointing at the packaged migrations; `url` only matters for offline rendering."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if url is not None:
        rendered = url.render_as_string(hide_password=False) if isinstance(url, URL) else url
        config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return config


def head_revision() -> str:
    """The single head revision this build expects."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError("the migrations package has no revisions")
    return head


async def migrate(
    url: str | URL, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT, timeout: float = DEFAULT_TIMEOUT
) -> tuple[str, ...]:
    """Upgrade to head under the migration lock, waiting at most `lock_timeout`; returns the revisions applied.

    Raises `StoreUnavailable` if the database cannot be reached within `timeout` (`database.timeout`) or the lock
    cannot be had within `lock_timeout`. A second caller that obtained the
    lock after the first finds nothing to apply and returns `()` (S-122).
    """
    applied: list[str] = []
    engine = create_engine(url, timeout=lock_timeout, connect_timeout=timeout)
    try:
        with translate_errors():
            async with engine.connect() as connection:
                # SQLite: the exclusive transaction is the lock; PostgreSQL: an advisory lock inside it.
                await connection.execution_options(**{BEGIN_OPTION: "EXCLUSIVE"})
                async with connection.begin():
                    await acquire_migration_lock(connection, timeout=lock_timeout)
                    await connection.run_sync(_upgrade, applied)
    finally:
        await engine.dispose()
    return tuple(applied)


def _upgrade(connection: Connection, applied: list[str]) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    config.attributes["on_version_apply"] = lambda *, step, **_: applied.extend(step.up_revision_ids)
    command.upgrade(config, "head")


async def check_schema(url: str | URL, *, timeout: float = DEFAULT_TIMEOUT) -> SchemaStatus:
    """Compare the database at `url` with this build, changing nothing (S-123)."""
    engine = create_engine(url, timeout=timeout)
    try:
        async with read_transaction(engine) as connection:
            with translate_errors():
                return await connection.run_sync(_inspect)
    finally:
        await engine.dispose()


async def current_revisions(engine: AsyncEngine) -> tuple[str, ...]:
    """The revisions the database records as applied, sorted: one read on `engine`'s pool (the cheap half of the
    readiness check, http/readiness.py)."""
    async with read_transaction(engine) as connection:
        return await connection.run_sync(_applied_revisions)


def _applied_revisions(connection: Connection) -> tuple[str, ...]:
    return tuple(sorted(MigrationContext.configure(connection).get_current_heads()))


async def require_current_schema(url: str | URL, *, timeout: float = DEFAULT_TIMEOUT) -> SchemaStatus:
    """`check_schema()`, raising `SchemaMismatch` unless the schema is exactly the build's (S-122, §10.3)."""
    status = await check_schema(url, timeout=timeout)
    if not status.is_current:
        found = ", ".join(status.current) or "none"
        raise SchemaMismatch(
            f"database schema is not this build's: revision {found}, expected {status.head}, "
            f"{len(status.differences)} difference(s); run `candor migrate`"
        )
    return status


def _inspect(connection: Connection) -> SchemaStatus:
    context = MigrationContext.configure(
        connection,
        opts={
            "include_name": include_name,
            "include_object": include_object_for(connection.dialect.name),
            "compare_type": True,
            "target_metadata": metadata,
        },
    )
    current = _applied_revisions(connection)
    differences = [_describe(diff) for diff in compare_metadata(context, metadata)]
    differences += _unwanted_foreign_keys(connection)
    expected = trigger_names(GUARDS, dialect_name(connection))
    present = existing_trigger_names(connection)
    differences += [f"add_trigger {name}" for name in sorted(expected - present)]
    differences += [f"remove_trigger {name}" for name in sorted(present - expected)]
    return SchemaStatus(current=current, head=head_revision(), differences=tuple(differences))


def _describe(diff: Any) -> str:
    """A one-line description of one `compare_metadata` entry (a tuple, or a list of column modifications)."""
    if isinstance(diff, list):
        return "; ".join(_describe(item) for item in diff)
    operation, *subjects = diff
    names = [_name(subject) for subject in subjects if subject is not None and not isinstance(subject, dict)]
    return " ".join([str(operation), *names])[:300]


def _name(subject: Any) -> str:
    if isinstance(subject, Sequence) and not isinstance(subject, str):
        return ",".join(_name(item) for item in subject)
    table = getattr(subject, "table", None)
    name = getattr(subject, "name", None)
    if name is not None:
        return f"{table.name}.{name}" if table is not None and hasattr(table, "name") else str(name)
    return str(subject)
