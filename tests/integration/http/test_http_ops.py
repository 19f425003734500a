"""Health, readiness and metrics (§10.1, §10.4): S-120, S-121."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from candor.service.http import Readiness
from candor.service.http import readiness as readiness_module
from candor.service.http.readiness import Role
from candor.service.store.schema.migration import SchemaStatus

from http_support import app_for, client_for, error_of


@pytest.mark.parametrize("role", ["all", "control", "worker"])
async def test_healthz_is_always_200(db: Any, role: Role) -> None:
    """S-120: `/healthz` answers 200 `{"status": "ok", "role": R}` whenever HTTP is served, before startup too."""
    app = app_for(db, role=role)
    async with client_for(app) as client:
        before = await client.get("/healthz")
        async with app.router.lifespan_context(app):
            during = await client.get("/healthz")
    for response in (before, during):
        assert response.status_code == 200 and response.json() == {"status": "ok", "role": role}


@pytest.mark.parametrize("role", ["all", "worker"])
async def test_readyz_follows_startup(db: Any, role: Role) -> None:
    """S-121: 503 `dependency: "runtime"` before startup completes; 200 `{"status": "ready", "role": R}` once the
    lifespan started; 503 `runtime` again while draining."""
    app = app_for(db, role=role, server={"readiness_timeout": 60.0})  # the first probe compares the schema in full
    async with client_for(app) as client:
        before = await client.get("/readyz")
        async with app.router.lifespan_context(app):
            ready = await client.get("/readyz")
        draining = await client.get("/readyz")
    assert before.status_code == 503 and before.json() == {"status": "unavailable", "dependency": "runtime"}
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "role": role}
    assert draining.status_code == 503 and draining.json()["dependency"] == "runtime"


async def test_readyz_with_a_runner_owned_readiness(db: Any) -> None:
    """S-121: a process runner that passes its own `Readiness` decides when startup is complete; a dead background
    task makes the process unready; a lost notification connection keeps 200 with `degraded: ["notify"]`."""
    readiness = Readiness()
    app = app_for(db, readiness=readiness)
    async with client_for(app) as client, app.router.lifespan_context(app):
        assert (await client.get("/readyz")).json()["dependency"] == "runtime"
        readiness.started = True
        assert (await client.get("/readyz")).status_code == 200
        readiness.degraded.add("notify")
        degraded = await client.get("/readyz")
        assert degraded.status_code == 200 and degraded.json()["degraded"] == ["notify"]
        readiness.tasks_alive = lambda: False
        assert (await client.get("/readyz")).json() == {"status": "unavailable", "dependency": "runtime"}


async def test_readyz_reports_the_database(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """S-121, §10.1: a schema check that fails, finds another schema, or exceeds `server.readiness_timeout` →
    503 `dependency: "database"`."""

    async def slow(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(5)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError("connection refused")

    async def behind(*args: Any, **kwargs: Any) -> SchemaStatus:
        return SchemaStatus(current=("0000",), head="0001", differences=())

    for check in (slow, broken, behind):  # an app each: a slow comparison runs on past its probe (readiness.py)
        monkeypatch.setattr(readiness_module, "check_database_schema", check)
        app = app_for(db, server={"readiness_timeout": 0.05})
        async with client_for(app) as client, app.router.lifespan_context(app):
            response = await client.get("/readyz")
        assert response.status_code == 503, check.__name__
        assert response.json() == {"status": "unavailable", "dependency": "database"}
        assert response.headers["x-request-id"].startswith("req_")


async def test_metrics_are_prometheus_text(db: Any) -> None:
    """§10.4: `/metrics` serves the default registry in the Prometheus text format, without authentication."""
    async with client_for(app_for(db, role="worker")) as client:
        response = await client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        assert "# HELP" in response.text or "# TYPE" in response.text
        wrong = await client.post("/metrics")
        assert wrong.status_code == 404 and error_of(wrong)["details"]["kind"] == "route"


async def test_request_durations_are_labelled_by_route_template(api: Any) -> None:
    """§10.4: `candor_http_request_duration_seconds{method, route, status}` uses the route's template, not the
    raw path (ids would make the label set unbounded); unmatched paths share one label."""
    from prometheus_client import REGISTRY

    def count(route: str, status: str) -> float:
        value = REGISTRY.get_sample_value(
            "candor_http_request_duration_seconds_count", {"method": "GET", "route": route, "status": status}
        )
        return value or 0.0

    key = await api.key()
    before_run = count("/v1/runs/{run_id}", "404")
    before_unmatched = count("unmatched", "404")
    await api.client.get("/v1/runs/run_missing", headers=key.headers())
    await api.client.get("/v1/no/such/route", headers=key.headers())
    assert count("/v1/runs/{run_id}", "404") == before_run + 1
    assert count("unmatched", "404") == before_unmatched + 1
