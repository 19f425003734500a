"""Database faults in words and the transient verdict behind the attempt's retries (issue 34 items 1 and 4)."""

from __future__ import annotations

import asyncio
import errno
import socket
import sqlite3

import asyncpg
import pytest
from sqlalchemy import exc as sa_exc

from candor.service.errors import StoreUnavailable
from candor.service.protocol.db_faults import classify_database_error, describe_database_error


def _sqlite(message: str, code: int | None) -> sqlite3.Error:
    error = sqlite3.OperationalError(message)
    if code is not None:
        error.sqlite_errorcode = code
    return error


def _chained(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


TABLE: list[tuple[str, BaseException, str | None, bool | None, str | None]] = [
    # name, error, kind, transient, words the cause must contain
    (
        "asyncpg too many",
        asyncpg.TooManyConnectionsError("sorry, too many clients"),
        "too_many_connections",
        True,
        "too many connections",
    ),
    ("asyncpg starting", asyncpg.CannotConnectNowError("starting up"), "server_starting", True, "not accepting"),
    ("asyncpg admin shutdown", asyncpg.AdminShutdownError("terminating"), "server_shutdown", True, "shutting down"),
    ("asyncpg crash", asyncpg.CrashShutdownError("crash"), "server_crashed", True, "crashed"),
    (
        "serialization",
        asyncpg.SerializationError("could not serialize"),
        "serialization_failure",
        True,
        "serialization",
    ),
    ("deadlock", asyncpg.DeadlockDetectedError("deadlock"), "deadlock", True, "deadlock"),
    ("statement timeout", asyncpg.QueryCanceledError("canceling statement"), "statement_timeout", True, "timed out"),
    ("lock timeout", asyncpg.LockNotAvailableError("lock"), "lock_timeout", True, "lock"),
    ("pg disk full", asyncpg.DiskFullError("no space"), "disk_full", True, "disk full"),
    ("08006", asyncpg.ConnectionFailureError("lost"), "connection_lost", True, "connection"),
    ("08 class", asyncpg.ProtocolViolationError("bad"), "connection_lost", True, "connection"),
    ("53 class", asyncpg.ConfigurationLimitExceededError("limit"), "insufficient_resources", True, "resources"),
    (
        "connection gone",
        asyncpg.ConnectionDoesNotExistError("closed mid-operation"),
        "connection_lost",
        True,
        "connection",
    ),
    ("asyncpg interface", asyncpg.InterfaceError("cannot perform operation"), "connection_lost", True, "connection"),
    ("wrong password", asyncpg.InvalidPasswordError("auth"), "authentication_failed", False, "authentication"),
    ("no database", asyncpg.InvalidCatalogNameError("x"), "database_missing", False, "does not exist"),
    ("unique violation", asyncpg.UniqueViolationError("dup"), None, None, None),
    ("sqlite busy", _sqlite("database is locked", 5), "database_locked", True, "database is locked"),
    ("sqlite locked table", _sqlite("database table is locked", 6), "database_locked", True, "locked"),
    ("sqlite full", _sqlite("database or disk is full", 13), "disk_full", True, "disk full"),
    ("sqlite extended busy", _sqlite("database is locked", 5 | (1 << 8)), "database_locked", True, "locked"),
    ("sqlite ioerr", _sqlite("disk I/O error", 10), "disk_io_error", True, "I/O"),
    ("sqlite full, no code", _sqlite("database or disk is full", None), "disk_full", True, "disk full"),
    ("sqlite busy, no code", _sqlite("database is locked", None), "database_locked", True, "database is locked"),
    ("sqlite readonly", _sqlite("attempt to write a readonly database", 8), "read_only", False, "read-only"),
    ("sqlite corrupt", _sqlite("database disk image is malformed", 11), "corrupt", False, "corrupt"),
    (
        "refused",
        ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed ('127.0.0.1', 5432)"),
        "connection_refused",
        True,
        "connection refused by 127.0.0.1:5432",
    ),
    (
        "refused, several addresses",
        OSError(
            "Multiple exceptions: [Errno 111] Connect call failed ('::1', 5432, 0, 0), [Errno 111] Connect call "
            "failed ('127.0.0.1', 5432)"
        ),
        "connection_refused",
        True,
        "connection refused by [::1]:5432",
    ),
    ("reset", ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "connection_reset", True, "reset"),
    ("broken pipe", BrokenPipeError(errno.EPIPE, "Broken pipe"), "connection_reset", True, "reset"),
    ("connect timeout", TimeoutError(errno.ETIMEDOUT, "timed out"), "connect_timeout", True, "timed out"),
    ("asyncio timeout", TimeoutError(), "timeout", True, "timed out"),
    ("no space", OSError(errno.ENOSPC, "No space left on device"), "disk_full", True, "disk full"),
    ("unreachable", OSError(errno.EHOSTUNREACH, "No route to host"), "unreachable", True, "no route"),
    ("dns", socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "name_not_resolved", True, "not resolved"),
    (
        "pool timeout",
        sa_exc.TimeoutError("QueuePool limit of size 5 overflow 10 reached"),
        "pool_exhausted",
        True,
        "pool",
    ),
    ("plain value error", ValueError("nope"), None, None, None),
    (
        "sqlalchemy wraps asyncpg",
        sa_exc.OperationalError("SELECT 1", {}, asyncpg.TooManyConnectionsError("too many clients")),
        "too_many_connections",
        True,
        "too many connections",
    ),
    (
        "sqlalchemy wraps sqlite",
        sa_exc.OperationalError("INSERT", {}, _sqlite("database or disk is full", 13)),
        "disk_full",
        True,
        "disk full",
    ),
    (
        "StoreUnavailable chained",
        _chained(
            StoreUnavailable("database unavailable"),
            ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed ('10.0.0.5', 6432)"),
        ),
        "connection_refused",
        True,
        "connection refused by 10.0.0.5:6432",
    ),
]


@pytest.mark.parametrize(("name", "error", "kind", "transient", "words"), TABLE, ids=[row[0] for row in TABLE])
def test_classification_table(
    name: str, error: BaseException, kind: str | None, transient: bool | None, words: str | None
) -> None:
    """Issue 34 items 1 and 4 (S-50, §7.8.1): asyncpg, SQLite, OS and SQLAlchemy errors → kind, transient verdict and
    the cause in words; errors that are no database fault → None."""
    fault = classify_database_error(error)
    if kind is None:
        assert fault is None
        return
    assert fault is not None
    assert (fault.kind, fault.transient) == (kind, transient)
    assert words is not None and words in fault.cause


def test_refused_connection_names_the_configured_endpoint_when_the_error_does_not() -> None:
    """Issue 34 item 4: "connection refused by host:port" even when the OS error carries no address."""
    fault = classify_database_error(ConnectionRefusedError(errno.ECONNREFUSED, "refused"), endpoint="db.internal:5432")
    assert fault is not None and fault.cause == "connection refused by db.internal:5432"


def test_describe_names_the_cause_and_the_drivers_class() -> None:
    """Issue 34 item 4: the log text is the cause in words and the innermost exception class."""
    wrapped = _chained(StoreUnavailable("database unavailable"), asyncpg.TooManyConnectionsError("too many"))
    assert describe_database_error(wrapped) == "too many connections (TooManyConnectionsError)"
    assert describe_database_error(ValueError("x")) == "ValueError"


def test_the_stores_own_unavailable_is_transient() -> None:
    """Issue 34 item 1: a `StoreUnavailable` with no driver error under it (the SQLite writer gate's wait ran out)
    is retried, its message the cause; a driver error under it decides instead."""
    fault = classify_database_error(StoreUnavailable("database unavailable: the SQLite writer was busy for 5 s"))
    assert fault is not None and (fault.kind, fault.transient) == ("unavailable", True)
    assert fault.cause == "the SQLite writer was busy for 5 s"
    wrong = _chained(StoreUnavailable("database unavailable"), asyncpg.InvalidPasswordError("auth"))
    assert classify_database_error(wrong) == classify_database_error(asyncpg.InvalidPasswordError("auth"))


def test_a_suppressed_context_is_not_the_cause() -> None:
    """Issue 34 item 4: `raise StoreUnavailable(...) from None` (the SQLite writer gate) is described by its own
    message, not by the timeout it replaced."""
    try:
        try:
            raise TimeoutError
        except TimeoutError:
            raise StoreUnavailable("database unavailable: the writer was held for over 5 s") from None
    except StoreUnavailable as error:
        fault = classify_database_error(error)
    assert fault is not None and fault.cause == "the writer was held for over 5 s"


async def test_a_timeout_is_not_described_as_a_cancellation() -> None:
    """Issue 34 item 4: `asyncio.timeout` raises `TimeoutError` over the `CancelledError` that stopped the call; the
    line names the timeout."""
    with pytest.raises(TimeoutError) as caught:
        async with asyncio.timeout(0):
            await asyncio.sleep(1)
    assert describe_database_error(caught.value) == "database call timed out (TimeoutError)"


def test_chain_cycles_end() -> None:
    """A chain that loops back on itself is walked once."""
    first, second = ValueError("a"), ValueError("b")
    first.__cause__, second.__cause__ = second, first
    assert classify_database_error(first) is None
