"""The schema half of `/readyz` (§10.1, S-121, S-122): the full comparison at most once a minute, the applied
revisions at every probe in between (`readiness.SchemaWatch`)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy import text

from candor.service.http import Readiness
from candor.service.http import readiness as readiness_module
from candor.service.http.readiness import SCHEMA_RECHECK_SECONDS, SchemaWatch
from candor.service.store.migrate import head_revision

from http_support import app_for, client_for

_UNHURRIED = {"readiness_timeout": 60.0}
"""These tests count which checks a probe runs; under CI's load the full comparison once overran the default 2 s
and the probe answered 503 without a verdict, so they give it time."""


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _counting_full_checks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record each full comparison a probe runs (its verdict), running the real one."""
    verdicts: list[bool] = []
    real = readiness_module.check_database_schema

    async def counted(*args: Any, **kwargs: Any) -> Any:
        status = await real(*args, **kwargs)
        verdicts.append(status.is_current)
        return status

    monkeypatch.setattr(readiness_module, "check_database_schema", counted)
    return verdicts


async def test_probes_compare_the_schema_once_a_minute(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """§10.1, S-121: the first probe runs the full comparison; probes within `SCHEMA_RECHECK_SECONDS` of it read only
    the revisions and stay 200; the first probe after that compares again."""
    clock = _Clock()
    readiness = Readiness(started=True, schema=SchemaWatch(clock=clock))
    full = _counting_full_checks(monkeypatch)
    app = app_for(db, readiness=readiness, server=_UNHURRIED)
    async with client_for(app) as client, app.router.lifespan_context(app):
        for _ in range(3):
            assert (await client.get("/readyz")).status_code == 200
            clock.now += 1
        assert full == [True]
        clock.now += SCHEMA_RECHECK_SECONDS
        assert (await client.get("/readyz")).status_code == 200
    assert full == [True, True]


async def test_a_revision_change_is_seen_at_the_next_probe(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """S-121, S-122: when the database's applied revision changes after a passing comparison, the next probe
    compares again and answers 503 `database`; once the revision is this build's again, 200."""
    readiness = Readiness(started=True, schema=SchemaWatch(clock=_Clock()))
    full = _counting_full_checks(monkeypatch)
    app = app_for(db, readiness=readiness, server=_UNHURRIED)
    head = head_revision()
    async with client_for(app) as client, app.router.lifespan_context(app):
        assert (await client.get("/readyz")).status_code == 200
        async with db.engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = '0001'"))
        try:
            behind = await client.get("/readyz")
        finally:
            async with db.engine.begin() as conn:
                await conn.execute(text("UPDATE alembic_version SET version_num = :head"), {"head": head})
        back = await client.get("/readyz")
    assert behind.status_code == 503 and behind.json() == {"status": "unavailable", "dependency": "database"}
    assert back.status_code == 200
    assert full == [True, False, True]


async def test_probes_are_timed_but_not_logged(db: Any, caplog: pytest.LogCaptureFixture) -> None:
    """§10.1: probe requests are not logged; other requests log one `HTTP request` line each."""
    readiness = Readiness(started=True)
    app = app_for(db, readiness=readiness)
    with caplog.at_level(logging.INFO, logger="candor.http"):
        async with client_for(app) as client, app.router.lifespan_context(app):
            for path in ("/healthz", "/readyz", "/metrics", "/v1/no/such/route"):
                await client.get(path)
    logged = [record.__dict__.get("route") for record in caplog.records if record.getMessage() == "HTTP request"]
    assert logged == ["unmatched"]
