"""The serve process's performance settings: `server.event_loop`, `server.http_parser`, `database.pool_size` and
`database.max_overflow` — validated, and applied to the loop, uvicorn and the engine's pool (docs/operations.md)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
import uvloop
from pydantic import ValidationError

from candor.service.core import Service, pool_size_for
from candor.service.process import loop_factory
from candor.service.settings import ServiceSettings
from candor.service.store.db.engine import create_engine


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
        fields: dict[str, Any] = {section: values}
        ServiceSettings(**fields)
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
    process.serve = fake_serve
    try:
        process.run(ServiceSettings(), "control")
        process.run(ServiceSettings(server={"event_loop": "asyncio"}), "control")
    finally:
        process.serve = original
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


def test_sqlite_engine_ignores_the_pool_settings(tmp_path: Any) -> None:
    """SQLite has one writer; its engine keeps SQLAlchemy's own pool whatever the settings say."""
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}", pool_size=50, max_overflow=7)
    assert engine.pool.size() != 50  # type: ignore[attr-defined]  # QueuePool's, not on Pool
    asyncio.run(engine.dispose())


class _Cycle:
    """A reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_startup_objects_are_frozen_after_collecting_startup_garbage() -> None:
    """A process's startup objects leave the cyclic collector's generations (`gc.freeze`), so no full collection
    walks them again (a full collection paused the event loop); garbage startup left is collected first, not
    frozen for the process's life."""
    import weakref

    from candor.service.process import _freeze_startup_objects

    garbage = _Cycle()
    collected = weakref.ref(garbage)
    del garbage
    kept = _Cycle()
    frozen_before = gc.get_freeze_count()
    try:
        _freeze_startup_objects()
        assert collected() is None
        assert gc.get_freeze_count() > frozen_before
        assert gc.get_count()[0] < 100  # the generations were emptied into the permanent one
        del kept
    finally:
        gc.unfreeze()


async def test_serve_freezes_its_startup_objects_before_serving_http(tmp_path: Any, monkeypatch: Any) -> None:
    """`serve` freezes once the process is prepared and its app built, before uvicorn answers a request."""
    import candor.service.process as process
    from candor.service.listen import bind_listener

    seen: list[int] = []

    async def serve_http(self: Any, sockets: Any = None) -> None:  # the HTTP task ends at once, so `serve` stops
        seen.append(gc.get_freeze_count())

    monkeypatch.setattr(process._Server, "serve", serve_http)
    gc.unfreeze()
    try:
        await process.serve(
            ServiceSettings(database={"url": f"sqlite:///{tmp_path / 'c.db'}"}),
            "control",
            listener=bind_listener("127.0.0.1:0"),  # not the default port, which may be taken
        )
    finally:
        gc.unfreeze()
    assert seen and seen[0] > 0


def test_message_schemas_are_built_by_build_message_schemas_not_by_the_first_run() -> None:
    """pydantic-ai defers its message schemas; `build_message_schemas` builds them (otherwise paid inside a new
    worker's first boundary). A fresh interpreter, since this one has long built them."""
    import subprocess
    import sys

    probe = """
from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.messages import ToolReturnPart
from candor.service.store.checkpoints import build_message_schemas
owner = next(vars(c)["__pydantic_serializer__"] for c in ToolReturnPart.__mro__ if "__pydantic_serializer__" in vars(c))
print(ModelMessagesTypeAdapter.pydantic_complete, ToolReturnPart in owner._serializers)
build_message_schemas()
print(ModelMessagesTypeAdapter.pydantic_complete, ToolReturnPart in owner._serializers)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["False", "False", "True", "True"]


async def test_serve_builds_the_message_schemas_before_freezing(tmp_path: Any, monkeypatch: Any) -> None:
    """`serve` builds the message schemas once prepared, before the freeze and before uvicorn answers a request."""
    import candor.service.process as process
    from candor.service.listen import bind_listener

    calls: list[str] = []
    monkeypatch.setattr(process, "build_message_schemas", lambda: calls.append("build"))
    monkeypatch.setattr(process, "_freeze_startup_objects", lambda: calls.append("freeze"))

    async def serve_http(self: Any, sockets: Any = None) -> None:  # the HTTP task ends at once, so `serve` stops
        calls.append("http")

    monkeypatch.setattr(process._Server, "serve", serve_http)
    await process.serve(
        ServiceSettings(database={"url": f"sqlite:///{tmp_path / 'c.db'}"}),
        "control",
        listener=bind_listener("127.0.0.1:0"),  # not the default port, which may be taken
    )
    assert calls == ["build", "freeze", "http"]
