"""What `candor` prints when the database cannot be reached (§10.3; issue 35)."""

from __future__ import annotations

import errno

import pytest

from candor.service.errors import StoreUnavailable
from candor.service.protocol.db_faults import describe_database_error, plain_cause
from candor.service.store.db.unreachable import database_location, unreachable_message


@pytest.mark.parametrize(
    ("url", "location"),
    [
        ("postgresql://candor:secret@db.internal:6543/candor", "db.internal:6543/candor"),
        ("postgresql://candor@db.internal/candor", "db.internal:5432/candor"),
        ("postgresql:///candor", "localhost:5432/candor"),
        ("postgresql://u@[::1]:5433/x", "[::1]:5433/x"),
        ("sqlite:///var/lib/candor.db", "file var/lib/candor.db"),
    ],
)
def test_database_location_names_host_port_and_database_never_the_password(url: str, location: str) -> None:
    """§10.3: where candor looked; the default PostgreSQL port spelled out; never the password."""
    assert database_location(url) == location
    assert "secret" not in database_location(url)


def _chained(outer: BaseException, cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise outer from inner
    except BaseException as raised:
        return raised


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (
            _chained(StoreUnavailable("x"), ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")),
            "connection refused",
        ),
        (_chained(StoreUnavailable("x"), TimeoutError()), "timed out"),
        (
            _chained(StoreUnavailable("x"), RuntimeError("no pg_hba.conf entry\nsecond line")),
            "RuntimeError: no pg_hba.conf entry",
        ),
        (StoreUnavailable(""), "StoreUnavailable"),
    ],
)
def test_unreachable_reason_is_the_deepest_cause_said_plainly(error: BaseException, reason: str) -> None:
    """§10.3: "connection refused" apart from "timed out", never only the wrapper's class name."""
    assert plain_cause(error) == reason


def test_unreachable_message() -> None:
    """§10.3 (issue 35): the one line names host, port and database and the reason."""
    error = _chained(StoreUnavailable("x"), ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"))
    assert (
        unreachable_message("postgresql://postgres@127.0.0.1:1/none", error)
        == "database unreachable at 127.0.0.1:1/none (connection refused)"
    )


def test_unreachable_reason_reads_the_chain_the_logs_read() -> None:
    """Issue 37 item 5: one wording of database errors. The CLI's reason and the logs' cause walk the same chain
    (protocol/db_faults.py), SQLAlchemy's `orig` included, which `__cause__`/`__context__` alone would miss."""

    class Wrapped(Exception):
        orig = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")

    error = Wrapped("(asyncpg) connection failed")
    assert plain_cause(error) == "connection refused"
    assert describe_database_error(error) == "connection refused (ConnectionRefusedError)"
