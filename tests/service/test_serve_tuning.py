"""The serve process's performance settings: `server.event_loop`, `server.http_parser`, `database.pool_size` and
`database.max_overflow` — validated, and applied to the loop, uvicorn and the engine's pool (docs/operations.md)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvloop
from pydantic import ValidationError

from candor.service.core import Service, pool_size_for
from candor.service.process import loop_factory
from candor.service.settings import ServiceSettings


def test_defaults_are_uvloop_httptools_and_a_pool_of_ten_plus_four() -> None:
    """The defaults a process serves with (docs/operations.md, "Tuning a process")."""
    settings = ServiceSettings()
    assert (settings.server.event_loop, settings.server.http_parser) == ("uvloop", "httptools")
    assert (pool_size_for(settings), settings.database.max_overflow) == (10, 4)


@pytest.mark.parametrize(("database", "slots", "expected"), [({}, 1, 10), ({}, 4096, 10), ({"pool_size": 40}, 4, 40)])
def test_pool_size_does_not_follow_the_worker_slots(database: dict[str, Any], slots: int, expected: int) -> None:
    """§7.8.1: a process's pool is `database.pool_size` (10 when unset) whatever `worker.slots` is."""
    settings = ServiceSettings(database=database, worker={"slots": slots})
    assert pool_size_for(settings) == expected


@pytest.mark.parametrize(
    ("section", "values", "field"),
    [
        ("database", {"pool_size": 0}, "pool_size"),
        ("database", {"max_overflow": -1}, "max_overflow"),
        ("database", {"pool_size": 1001}, "pool_size"),
        ("server", {"event_loop": "trio"}, "event_loop"),
        ("server", {"http_parser": "h2"}, "http_parser"),
    ],
)
def test_out_of_bounds_values_are_refused_naming_the_field(section: str, values: dict[str, Any], field: str) -> None:
    """S-124: a value outside its bounds refuses the settings, and the message names the field."""
    with pytest.raises(ValidationError) as caught:
        ServiceSettings(**{section: values})
    assert field in str(caught.value)


@pytest.mark.parametrize(("name", "loop_type"), [("uvloop", uvloop.Loop), ("asyncio", asyncio.BaseEventLoop)])
def test_loop_factory_builds_the_named_loop(name: Any, loop_type: type) -> None:
    loop = loop_factory(name)()
    try:
        assert isinstance(loop, loop_type)
        assert name != "asyncio" or not isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_serve_runs_on_the_configured_loop() -> None:
    """`process.run` hands `serve` the loop `server.event_loop` names (checked from inside the coroutine)."""
    import candor.service.process as process

    seen: list[bool] = []

    async def fake_serve(settings: Any, role: Any, **_: Any) -> None:
        seen.append(isinstance(asyncio.get_running_loop(), uvloop.Loop))

    original = process.serve
    process.serve = fake_serve  # type: ignore[assignment]
    try:
        process.run(ServiceSettings(), "control")
        process.run(ServiceSettings(server={"event_loop": "asyncio"}), "control")
    finally:
        process.serve = original  # type: ignore[assignment]
    assert seen == [True, False]


@pytest.mark.postgres
async def test_postgres_engine_pool_follows_the_settings(postgres_url: str) -> None:
    """`database.pool_size`/`max_overflow` size the PostgreSQL pool of `Service.open`; concurrent checkouts up to
    `pool_size` are kept open when returned, so a busy process does not reconnect for every request."""
    settings = ServiceSettings(database={"url": postgres_url, "pool_size": 3, "max_overflow": 2})
    service = await Service.open(settings)
    try:
        pool: Any = service.engine.pool
        assert (pool.size(), pool._max_overflow) == (3, 2)
        connections = [await service.engine.connect() for _ in range(5)]
        assert pool.checkedout() == 5
        for connection in connections:
            await connection.close()
        assert (pool.checkedin(), pool.checkedout()) == (3, 0)  # the 2 overflow connections were closed
    finally:
        await service.close()
