"""The schema half of `/readyz` (§10.1, S-121, S-122): the full comparison at most once a minute, the applied
revisions at every probe in between (`readiness.SchemaWatch`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from sqlalchemy import text

from candor.service.http import Readiness
from candor.service.http import readiness as readiness_module
from candor.service.http.readiness import SCHEMA_RECHECK_SECONDS, SchemaWatch
from candor.service.process import prepare
from candor.service.settings import ServiceSettings
from candor.service.store.schema.migration import SchemaStatus, head_revision

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
    real = readiness_module.check_database_schema  # type: ignore[attr-defined]  # the module's own binding, which the test patches

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
        await readiness.schema.settled()
    assert full == [True, True]


async def test_a_comparison_longer_than_the_probe_limit_still_finishes(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S-121, §10.1: a probe whose full comparison exceeds `server.readiness_timeout` answers 503 `database`, but the
    comparison runs on; the next probe takes its verdict instead of starting (and cancelling) another. Before, every
    probe cancelled its own comparison at the limit and a loaded process never became ready."""
    real = readiness_module.check_database_schema  # type: ignore[attr-defined]  # the module's own binding, which the test patches
    started: list[None] = []
    verdicts: list[bool] = []
    released = asyncio.Event()

    async def slow(*args: Any, **kwargs: Any) -> Any:
        started.append(None)
        await released.wait()
        status = await real(*args, **kwargs)
        verdicts.append(status.is_current)
        return status

    monkeypatch.setattr(readiness_module, "check_database_schema", slow)
    readiness = Readiness(started=True, schema=SchemaWatch(clock=_Clock()))
    # The limit must leave the second probe time for its one revision read (a new pool connection) under CI's load.
    app = app_for(db, readiness=readiness, server={"readiness_timeout": 3.0})
    async with client_for(app) as client, app.router.lifespan_context(app):
        first = await client.get("/readyz")
        released.set()
        await readiness.schema.settled()
        second = await client.get("/readyz")
    assert first.status_code == 503 and first.json()["dependency"] == "database"
    assert second.status_code == 200
    assert len(started) == 1 and verdicts == [True]  # the second probe took the first one's verdict


async def test_concurrent_probes_share_one_comparison(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """§10.1: probes that arrive while a full comparison runs wait for that one; they do not each start their own."""
    full = _counting_full_checks(monkeypatch)
    readiness = Readiness(started=True, schema=SchemaWatch(clock=_Clock()))
    app = app_for(db, readiness=readiness, server=_UNHURRIED)
    async with client_for(app) as client, app.router.lifespan_context(app):
        responses = await asyncio.gather(*(client.get("/readyz") for _ in range(5)))
    assert [response.status_code for response in responses] == [200] * 5
    assert full == [True]


async def test_a_stale_verdict_answers_while_the_next_comparison_runs(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """S-121: past `SCHEMA_RECHECK_SECONDS`, with the revisions unchanged, a probe answers from the last verdict and
    starts a fresh comparison in the background; once that one finds a difference (here: a schema that no longer
    matches), probes answer 503 `database`."""
    clock = _Clock()
    readiness = Readiness(started=True, schema=SchemaWatch(clock=clock))
    app = app_for(db, readiness=readiness, server=_UNHURRIED)
    async with client_for(app) as client, app.router.lifespan_context(app):
        assert (await client.get("/readyz")).status_code == 200
        applied = readiness.schema.revisions

        async def drifted(*args: Any, **kwargs: Any) -> SchemaStatus:
            return SchemaStatus(current=applied, head=head_revision(), differences=("remove_index ix_runs_state",))

        monkeypatch.setattr(readiness_module, "check_database_schema", drifted)
        clock.now += SCHEMA_RECHECK_SECONDS
        during = await client.get("/readyz")
        await readiness.schema.settled()
        after = await client.get("/readyz")
    assert during.status_code == 200
    assert after.status_code == 503 and after.json() == {"status": "unavailable", "dependency": "database"}


async def test_the_startup_check_spares_the_first_probe(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """S-122, §10.1: `candor serve` compares the schema before it starts (`process.prepare`) and hands the verdict
    to readiness, so its first probes read only the revisions."""
    readiness = Readiness(started=True, schema=SchemaWatch(clock=_Clock()))
    settings = ServiceSettings(database={"url": db.url})
    service = await prepare(settings, "control", schema=readiness.schema)
    await service.close()
    full = _counting_full_checks(monkeypatch)
    app = app_for(db, readiness=readiness, server=_UNHURRIED)
    async with client_for(app) as client, app.router.lifespan_context(app):
        assert (await client.get("/readyz")).status_code == 200
    assert full == []


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
