"""Database faults in words: is an error a passing blip worth retrying, and what should an operator read.

`classify_database_error(error)` walks an exception's chain (`__cause__`, `__context__`, SQLAlchemy's `orig`) and
answers with the first link it recognizes: a `DatabaseFault` with a stable `kind`, a `transient` verdict and a
`cause` in words. It reads only what exceptions carry (SQLSTATE, SQLite's error code, errno, class names), so it
needs no driver and no I/O. Transient: lost or refused connections (08xxx, OS errors), an exhausted server or pool
(53xxx), a server stopping or starting (57P01–57P03), statement and lock timeouts (57014, 55P03), serialization
failures and deadlocks (40001, 40P01), SQLite busy/locked/full/I-O errors, and a `StoreUnavailable` the store
raised on its own. Not transient: wrong credentials (28xxx), a missing database (3D000), a read-only or corrupt
SQLite file; retrying those only delays the answer.
"""

from __future__ import annotations

import asyncio
import errno
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from ..errors import StoreUnavailable

__all__ = ("DatabaseFault", "classify_database_error", "describe_database_error", "fault_chain", "plain_cause")


@dataclass(frozen=True, slots=True)
class DatabaseFault:
    """What went wrong with the database, for the retry decision and for the logs."""

    kind: str
    """A stable short name (`too_many_connections`, `connection_refused`, `disk_full`, …) for metrics and tests."""
    transient: bool
    """Whether the same request may succeed if tried again shortly (retry with backoff, within the lease)."""
    cause: str
    """What happened, in words, for a log line (never parameters or message text)."""


def _fault(kind: str, cause: str, *, transient: bool = True) -> DatabaseFault:
    return DatabaseFault(kind=kind, transient=transient, cause=cause)


_SQLSTATES: Final[dict[str, DatabaseFault]] = {
    "53300": _fault("too_many_connections", "too many connections"),
    "53100": _fault("disk_full", "disk full"),
    "53200": _fault("out_of_memory", "database server out of memory"),
    "57P01": _fault("server_shutdown", "database server shutting down (administrator command)"),
    "57P02": _fault("server_crashed", "database server crashed and is restarting"),
    "57P03": _fault("server_starting", "database server not accepting connections yet"),
    "57014": _fault("statement_timeout", "statement timed out"),
    "55P03": _fault("lock_timeout", "lock wait timed out"),
    "40001": _fault("serialization_failure", "serialization failure"),
    "40P01": _fault("deadlock", "deadlock detected"),
    "3D000": _fault("database_missing", "database does not exist", transient=False),
    "28P01": _fault("authentication_failed", "password authentication failed", transient=False),
    "28000": _fault("authentication_failed", "authorization rejected", transient=False),
}
"""PostgreSQL SQLSTATEs with a meaning of their own; whole classes are in `_SQLSTATE_CLASSES`."""

_SQLSTATE_CLASSES: Final[dict[str, DatabaseFault]] = {
    "08": _fault("connection_lost", "connection to the database failed"),
    "53": _fault("insufficient_resources", "database server out of resources"),
    "57P": _fault("server_unavailable", "database server unavailable"),
    "28": _fault("authentication_failed", "authentication rejected", transient=False),
}

_SQLITE_CODES: Final[dict[int, DatabaseFault]] = {
    5: _fault("database_locked", "database is locked"),  # SQLITE_BUSY
    6: _fault("database_locked", "database table is locked"),  # SQLITE_LOCKED
    13: _fault("disk_full", "disk full"),  # SQLITE_FULL
    10: _fault("disk_io_error", "disk I/O error"),  # SQLITE_IOERR
    14: _fault("cannot_open", "unable to open the database file"),  # SQLITE_CANTOPEN
    8: _fault("read_only", "database is read-only", transient=False),  # SQLITE_READONLY
    11: _fault("corrupt", "database file is corrupt", transient=False),  # SQLITE_CORRUPT
    26: _fault("corrupt", "file is not a database", transient=False),  # SQLITE_NOTADB
}
"""SQLite primary result codes (`sqlite_errorcode & 0xFF`)."""

_SQLITE_MESSAGES: Final[tuple[tuple[str, int], ...]] = (
    ("database is locked", 5),
    ("database table is locked", 6),
    ("database or disk is full", 13),
    ("disk i/o error", 10),
    ("unable to open database file", 14),
    ("attempt to write a readonly database", 8),
    ("database disk image is malformed", 11),
)
"""The same, by message, for a SQLite error that does not carry its code."""

_ADDRESS = re.compile(r"\(\s*'([^']+)',\s*(\d+)")
"""The first `('host', port` in an OS error's text (asyncio: `Connect call failed ('127.0.0.1', 5432)`)."""

_CONNECTION_LOST_TYPES: Final = frozenset(
    {"ConnectionDoesNotExistError", "ConnectionFailureError", "InternalClientError", "ClientConfigurationError"}
)
"""asyncpg's errors without a SQLSTATE that mean the connection is gone (configuration errors are not)."""


def fault_chain(error: BaseException) -> Iterator[BaseException]:
    """`error`, then what it wraps: SQLAlchemy's `orig`, `__cause__`, `__context__` unless suppressed (each once,
    cycles cut)."""
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        context = None if current.__suppress_context__ else current.__context__  # `raise … from None` cut it
        for linked in (getattr(current, "orig", None), current.__cause__, context):
            if isinstance(linked, BaseException):
                pending.append(linked)


def classify_database_error(error: BaseException, *, endpoint: str | None = None) -> DatabaseFault | None:
    """The first recognizable database fault in `error`'s chain, or None when nothing in it is one.

    `endpoint` (`host:port`, or a SQLite file) completes a refused connection's cause when the error does not name
    the address itself."""
    for link in fault_chain(error):
        found = _classify_one(link, endpoint)
        if found is not None:
            return found
    for link in fault_chain(error):
        if isinstance(link, StoreUnavailable):  # the store's own verdict (a writer-gate wait, a closed connection)
            return _fault("unavailable", link.message.removeprefix("database unavailable: "))
    return None


def describe_database_error(error: BaseException, *, endpoint: str | None = None) -> str:
    """The cause of `error` in words, with its exception class: `too many connections (TooManyConnectionsError)`."""
    fault = classify_database_error(error, endpoint=endpoint)
    innermost = _innermost(error)
    if fault is None:
        return type(innermost).__name__
    return f"{fault.cause} ({type(innermost).__name__})"


def plain_cause(error: BaseException) -> str:
    """The deepest cause in `error`'s chain said plainly, for an operator's one line (`candor` when the database
    cannot be reached, store/db/unreachable.py): the OS's words for a socket error ("connection refused"), "timed
    out" for a timeout, else the innermost cause's own first line or type. `describe_database_error` says the same
    chain for the logs, by fault and class."""
    links = list(fault_chain(error))
    for link in reversed(links):
        if isinstance(link, TimeoutError):
            return "timed out"
        if isinstance(link, OSError) and link.strerror:
            return link.strerror.lower()
    deepest = _innermost(error)
    text = str(deepest).strip().splitlines()
    return f"{type(deepest).__name__}: {text[0]}" if text else type(deepest).__name__


def _innermost(error: BaseException) -> BaseException:
    """The last link of the chain but a cancellation (how `asyncio.timeout` stops a call, not why it failed): the
    driver's or the OS's own exception, the most telling class name."""
    links = [link for link in fault_chain(error) if not isinstance(link, asyncio.CancelledError)]
    return links[-1] if links else error


def _classify_one(error: BaseException, endpoint: str | None) -> DatabaseFault | None:
    names = {cls.__name__ for cls in type(error).__mro__}
    sqlstate = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    if isinstance(sqlstate, str) and sqlstate:
        return _by_sqlstate(sqlstate)
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(code, int) and (fault := _SQLITE_CODES.get(code & 0xFF)) is not None:
        return fault
    if "sqlite3" in type(error).__module__ or "OperationalError" in names:
        text = str(error).lower()
        for phrase, sqlite_code in _SQLITE_MESSAGES:
            if phrase in text:
                return _SQLITE_CODES[sqlite_code]
    if isinstance(error, OSError):
        return _by_os_error(error, endpoint)
    if isinstance(error, TimeoutError) or "TimeoutError" in names:
        if type(error).__module__.startswith("sqlalchemy"):
            return _fault("pool_exhausted", "no free connection in the pool (pool timeout)")
        return _fault("timeout", "database call timed out")
    if names & _CONNECTION_LOST_TYPES:
        return _fault("connection_lost", "connection to the database lost")
    if "InterfaceError" in names and "asyncpg" in type(error).__module__:
        return _fault("connection_lost", "connection to the database unusable")
    return None


def _by_sqlstate(sqlstate: str) -> DatabaseFault | None:
    if (fault := _SQLSTATES.get(sqlstate)) is not None:
        return fault
    for prefix in sorted(_SQLSTATE_CLASSES, key=len, reverse=True):
        if sqlstate.startswith(prefix):
            return _SQLSTATE_CLASSES[prefix]
    return None


def _by_os_error(error: OSError, endpoint: str | None) -> DatabaseFault:
    address = _address_of(error) or endpoint
    where = f" by {address}" if address else ""
    at = f" to {address}" if address else ""
    if (
        isinstance(error, ConnectionRefusedError)
        or error.errno == errno.ECONNREFUSED
        or "Connect call failed" in str(error)
    ):
        return _fault("connection_refused", f"connection refused{where}")
    if isinstance(error, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
        return _fault("connection_reset", f"connection{at} reset")
    if error.errno == errno.ETIMEDOUT:
        return _fault("connect_timeout", f"connection{at} timed out")
    if isinstance(error, TimeoutError):  # asyncio's timeouts carry no errno: a call that took too long
        return _fault("timeout", "database call timed out")
    if error.errno == errno.ENOSPC:
        return _fault("disk_full", "disk full")
    if error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return _fault("unreachable", f"no route{at}")
    if type(error).__name__ == "gaierror":
        return _fault("name_not_resolved", f"host name{' of ' + address if address else ''} not resolved")
    reason = error.strerror or type(error).__name__
    return _fault("network_error", f"network error{at}: {reason}")


def _address_of(error: OSError) -> str | None:
    match = _ADDRESS.search(str(error))
    if match is None:
        return None
    host, port = match.groups()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
