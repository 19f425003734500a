"""The schema-level half of the SQLite vs PostgreSQL branches: column types, the clock, triggers, statement parts.

`db/dialect.py` holds the other half (URLs, pools, connection setup and locks). Everything else in `store/` is
written once against SQLAlchemy Core and calls the helpers of the two where the backends differ (spec §2.2).
Trigger rules are declared as data in tables.py (`StatusGuard`, `LeaseGuard`, `InsertOnly`) and rendered here for
each dialect; both renderings raise an error that the drivers surface as `sqlalchemy.exc.IntegrityError`
(SQLite `RAISE(ABORT)` → SQLITE_CONSTRAINT; PostgreSQL SQLSTATE 23514).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    DDL,
    JSON,
    BigInteger,
    Double,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Table,
    UniqueConstraint,
    event,
    text,
    tuple_,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from ..db.dialect import DIALECTS, DialectName

__all__ = (
    "JSON_TYPE",
    "ID_INTEGER",
    "TIMESTAMP",
    "STRICTLY_INCREASING_IDS",
    "StatusGuard",
    "LeaseGuard",
    "InsertOnly",
    "db_now",
    "partial_index",
    "attach_guards",
    "guard_ddl",
    "insert_ignoring_conflicts",
    "now_sql",
    "trigger_names",
    "existing_trigger_names",
    "violated_constraint",
)

JSON_TYPE = JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
"""JSON columns: `JSON` (text) on SQLite, `JSONB` on PostgreSQL; Python `None` is stored as SQL NULL."""

ID_INTEGER = BigInteger().with_variant(Integer(), "sqlite")
"""Auto-increment integer keys: BIGSERIAL on PostgreSQL, the rowid alias `INTEGER PRIMARY KEY` on SQLite."""

TIMESTAMP: Double[float] = Double()
"""Every timestamp is float seconds since the Unix epoch, read from the database clock (`db_now()`)."""

STRICTLY_INCREASING_IDS: Mapping[str, Any] = {"sqlite_autoincrement": True}
"""Table options for integer ids that are never reused after deletes (SQLite `AUTOINCREMENT`; PG sequences)."""

_NOW_SQL: Mapping[DialectName, str] = {
    # SQLite < 3.42 has no unixepoch('subsec'); julianday('now') carries milliseconds of the host clock.
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
    "postgresql": "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)",
}


class db_now(FunctionElement[float]):
    """The database clock as float epoch seconds (§2.2): `clock_timestamp()` on PostgreSQL, the host on SQLite."""

    type = Double()
    inherit_cache = True


@compiles(db_now, "sqlite")
def _now_sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    return _NOW_SQL["sqlite"]


@compiles(db_now, "postgresql")
def _now_postgresql(element: db_now, compiler: Any, **kw: Any) -> str:
    return _NOW_SQL["postgresql"]


def past_keyset(
    created_at: ColumnElement[Any], row_id: ColumnElement[Any], cursor: tuple[float, str], *, newest_first: bool
) -> ColumnElement[bool]:
    """The rows a (`created_at`, `id`) keyset page continues with after `cursor`: one row-value comparison, which
    PostgreSQL and SQLite both turn into the start of an index range (an OR of two comparisons is applied as a
    filter after scanning from the first row)."""
    keys, bound = tuple_(created_at, row_id), tuple_(*cursor)
    return keys < bound if newest_first else keys > bound


def partial_index(name: str, *columns: str, where: str, unique: bool = False) -> Index:
    """An index over the rows matching `where` (same SQL text on both dialects)."""
    return Index(name, *columns, unique=unique, sqlite_where=text(where), postgresql_where=text(where))


# --- triggers ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class StatusGuard:
    """A status column whose rows start in `initial`, move only along `moves`, and freeze in `final`."""

    table: str
    initial: str
    final: tuple[str, ...]
    moves: tuple[tuple[str, str], ...]
    rules: str
    """Rule ids quoted in the error message."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaseGuard:
    """An expiry column that may not be pushed out once it has passed (database clock)."""

    table: str
    column: str
    rules: str


@dataclass(frozen=True, kw_only=True, slots=True)
class InsertOnly:
    """A table whose rows are never updated."""

    table: str
    rules: str


Guard = StatusGuard | LeaseGuard | InsertOnly


def _quoted(values: Iterable[str]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def _sqlite_trigger(name: str, timing: str, when: str, message: str) -> str:
    return f"CREATE TRIGGER {name} {timing} WHEN {when} BEGIN SELECT RAISE(ABORT, '{message}'); END"


def _pg_raise(message: str) -> str:
    return f"RAISE EXCEPTION '{message}' USING ERRCODE = 'check_violation';"


def _pg_function(name: str, body: str) -> str:
    return f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$\nBEGIN\n{body}\nEND\n$$"


def _pg_trigger(name: str, events: str, table: str, function: str) -> str:
    return f"CREATE TRIGGER {name} BEFORE {events} ON {table} FOR EACH ROW EXECUTE FUNCTION {function}()"


def _messages(guard: Guard) -> dict[str, str]:
    t, r = guard.table, guard.rules
    return {
        "insert": f"candor: {t}: rows must be inserted with status {getattr(guard, 'initial', '')} ({r})",
        "final": f"candor: {t}: rows in a final status are immutable ({r})",
        "move": f"candor: {t}: status change not allowed ({r})",
        "lease": f"candor: {t}: an expired lease cannot be extended ({r})",
        "update": f"candor: {t}: rows are insert-only ({r})",
    }


def guard_ddl(guard: Guard, dialect: DialectName) -> list[str]:
    """The CREATE statements (one statement each) enforcing `guard` on `dialect`."""
    m = _messages(guard)
    t = guard.table
    if isinstance(guard, StatusGuard):
        moves = _quoted(f"{a}>{b}" for a, b in guard.moves)
        final = _quoted(guard.final)
        if dialect == "sqlite":
            return [
                _sqlite_trigger(
                    f"trg_{t}_insert", f"BEFORE INSERT ON {t}", f"NEW.status IS NOT '{guard.initial}'", m["insert"]
                ),
                _sqlite_trigger(f"trg_{t}_final", f"BEFORE UPDATE ON {t}", f"OLD.status IN ({final})", m["final"]),
                _sqlite_trigger(
                    f"trg_{t}_move",
                    f"BEFORE UPDATE OF status ON {t}",
                    f"NEW.status IS NOT OLD.status AND (OLD.status || '>' || NEW.status) NOT IN ({moves})",
                    m["move"],
                ),
            ]
        body = (
            "IF TG_OP = 'INSERT' THEN\n"
            f"  IF NEW.status IS DISTINCT FROM '{guard.initial}' THEN {_pg_raise(m['insert'])} END IF;\n"
            "  RETURN NEW;\nEND IF;\n"
            f"IF OLD.status IN ({final}) THEN {_pg_raise(m['final'])} END IF;\n"
            "IF NEW.status IS DISTINCT FROM OLD.status\n"
            f"   AND (OLD.status || '>' || NEW.status) NOT IN ({moves}) THEN {_pg_raise(m['move'])} END IF;\n"
            "RETURN NEW;"
        )
        function = f"candor_{t}_status_guard"
        return [_pg_function(function, body), _pg_trigger(f"trg_{t}_status", "INSERT OR UPDATE", t, function)]
    if isinstance(guard, LeaseGuard):
        c = guard.column
        when = f"NEW.{c} > OLD.{c} AND OLD.{c} <= {_NOW_SQL[dialect]}"
        if dialect == "sqlite":
            return [_sqlite_trigger(f"trg_{t}_{c}", f"BEFORE UPDATE OF {c} ON {t}", when, m["lease"])]
        body = f"IF {when} THEN {_pg_raise(m['lease'])} END IF;\nRETURN NEW;"
        function = f"candor_{t}_{c}_guard"
        return [_pg_function(function, body), _pg_trigger(f"trg_{t}_{c}", f"UPDATE OF {c}", t, function)]
    if dialect == "sqlite":
        return [_sqlite_trigger(f"trg_{t}_insert_only", f"BEFORE UPDATE ON {t}", "1", m["update"])]
    function = f"candor_{t}_insert_only"
    return [
        _pg_function(function, _pg_raise(m["update"])),
        _pg_trigger(f"trg_{t}_insert_only", "UPDATE", t, function),
    ]


def _pg_functions(guard: Guard) -> list[str]:
    return [stmt.split()[2].removesuffix("()") for stmt in guard_ddl(guard, "postgresql") if "FUNCTION" in stmt[:16]]


def attach_guards(table: Table, guards: Iterable[Guard]) -> None:
    """Create the guards' triggers right after `table` (both dialects); drop PostgreSQL functions after it."""
    for guard in guards:
        for dialect in DIALECTS:
            for statement in guard_ddl(guard, dialect):
                event.listen(table, "after_create", DDL(statement).execute_if(dialect=dialect))  # type: ignore[no-untyped-call]
        for function in _pg_functions(guard):
            drop = DDL(f"DROP FUNCTION IF EXISTS {function}()").execute_if(dialect="postgresql")  # type: ignore[no-untyped-call]
            event.listen(table, "after_drop", drop)


# --- statements --------------------------------------------------------------------------------------------------


async def allocate_stream_ids(conn: AsyncConnection, thread_id: str, count: int) -> tuple[int | None, list[int]]:
    """The thread's last stream entry id and `count` new, increasing ids (store/threads/streams.py). PostgreSQL
    takes them from the table's sequence; SQLite, whose `AUTOINCREMENT` never reuses ids, from above both the
    highest id ever handed out and the highest present."""
    if conn.dialect.name == "postgresql":
        slots = list(range(count))
        rows = (await conn.execute(_PG_ALLOCATE_STREAM_IDS, {"thread_id": thread_id, "slots": slots})).all()
        return _int_or_none(rows[0].last), sorted(int(row.id) for row in rows)
    row = (await conn.execute(_SQLITE_ALLOCATE_STREAM_IDS, {"thread_id": thread_id})).one()
    return _int_or_none(row.last), list(range(int(row.top) + 1, int(row.top) + 1 + count))


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


_PG_ALLOCATE_STREAM_IDS = text(
    "SELECT nextval(pg_get_serial_sequence('stream_entries', 'id')) AS id, "
    "(SELECT max(id) FROM stream_entries WHERE thread_id = :thread_id) AS last "
    "FROM unnest(CAST(:slots AS INTEGER[]))"
)
"""One row per id to allocate. Rows come from `unnest` over an array of `count` slots rather than from
`generate_series(1, :count)`: PostgreSQL estimates a series over a parameter at 1,000 rows, which made the generic
plan look dearer than any custom one and kept the prepared statement re-planned at every call
(store/attempts/step_commit.py says the same of the step statement)."""
_SQLITE_ALLOCATE_STREAM_IDS = text(
    "SELECT (SELECT max(id) FROM stream_entries WHERE thread_id = :thread_id) AS last, "
    "max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'stream_entries'), 0), "
    "coalesce((SELECT max(id) FROM stream_entries), 0)) AS top"
)


def json_with_key_sql(dialect: str, *, json_param: str, key: str, value_sql: str) -> str:
    """SQL for the JSON object bound as `:json_param` with `key` set to the value of `value_sql`."""
    if dialect == "postgresql":
        return f"CAST(:{json_param} AS jsonb) || jsonb_build_object('{key}', {value_sql})"
    return f"json_insert(:{json_param}, '$.{key}', {value_sql})"


def insert_ignoring_conflicts(table: Table, dialect: DialectName, *, index_elements: Iterable[str]) -> Any:
    """`INSERT … ON CONFLICT (index_elements) DO NOTHING` for `dialect` (used by `enqueue_once`, S-107)."""
    module = sqlite if dialect == "sqlite" else postgresql
    return module.insert(table).on_conflict_do_nothing(index_elements=list(index_elements))


def now_sql(dialect: DialectName) -> str:
    """The raw SQL of `db_now()` for hand-written statements (triggers, migrations)."""
    return _NOW_SQL[dialect]


def trigger_names(guards: Iterable[Guard], dialect: DialectName) -> frozenset[str]:
    """Names of the triggers that `guards` create on `dialect`."""
    return frozenset(
        statement.split()[2]
        for guard in guards
        for statement in guard_ddl(guard, dialect)
        if statement.startswith("CREATE TRIGGER")
    )


def existing_trigger_names(connection: Any) -> frozenset[str]:
    """Trigger names present in the connected database (sync connection; current schema on PostgreSQL)."""
    if connection.dialect.name == "sqlite":
        query = "SELECT name FROM sqlite_master WHERE type = 'trigger'"
    else:
        query = (
            "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE NOT t.tgisinternal AND n.nspname = current_schema()"
        )
    return frozenset(row[0] for row in connection.exec_driver_sql(query))


_SQLITE_UNIQUE = re.compile(r"UNIQUE constraint failed: (.+)$")
_SQLITE_CHECK = re.compile(r"CHECK constraint failed: (\w+)")


def violated_constraint(error: Any) -> str | None:
    """Name of the unique/check constraint or index an `IntegrityError` reports, if it can be told.

    PostgreSQL reports the name; SQLite reports `table.column, …` for unique violations, which is mapped back to
    the unique constraint or unique index of tables.py over exactly those columns.
    """
    orig = getattr(error, "orig", error)  # SQLAlchemy's DBAPI error; asyncpg's own from `statements.fetch_rows`
    name = getattr(orig, "constraint_name", None) or getattr(getattr(orig, "__cause__", None), "constraint_name", None)
    if name:
        return str(name)
    message = str(orig)
    if match := _SQLITE_CHECK.search(message):
        return match.group(1)
    match = _SQLITE_UNIQUE.search(message)
    if match is None:
        return None
    qualified = [part.strip() for part in match.group(1).split(",")]
    if qualified[0].startswith("index '"):
        return qualified[0][len("index '") : -1]
    table = qualified[0].split(".", 1)[0]
    columns = tuple(part.split(".", 1)[1] for part in qualified)
    return _unique_names().get((table, columns))


def _unique_names() -> dict[tuple[str, tuple[str, ...]], str]:
    from .tables import metadata  # tables imports this module

    names: dict[tuple[str, tuple[str, ...]], str] = {}
    for table in metadata.tables.values():
        for constraint in table.constraints:
            if isinstance(constraint, (UniqueConstraint, PrimaryKeyConstraint)) and constraint.name:
                names[(table.name, tuple(c.name for c in constraint.columns))] = str(constraint.name)
        for index in table.indexes:
            if index.unique and index.name:
                names[(table.name, tuple(c.name for c in index.columns))] = str(index.name)
    return names
