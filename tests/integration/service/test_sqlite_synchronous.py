"""`database.sqlite_synchronous`: SQLite's `PRAGMA synchronous` on every connection of a process's engine, `full`
unless the operator accepts losing the last commits on power failure (docs/operations.md, "Tuning a process")."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from candor.service.core import Service
from candor.service.process import prepare
from candor.service.settings import ServiceSettings
from candor.service.store.db.dialect import BEGIN_OPTION, install_connection_hooks
from candor.service.store.db.engine import create_engine

# `PRAGMA synchronous` reads back as a number.
_LEVELS = {0: "off", 1: "normal", 2: "full", 3: "extra"}


async def _levels_of_pooled_connections(engine: Any, count: int = 3) -> set[str]:
    """The level every one of `count` connections held at once reports (each a connection of its own)."""
    # Deferred BEGIN: several open transactions at once may not all hold the write lock.
    connections = [await (await engine.connect()).execution_options(**{BEGIN_OPTION: "DEFERRED"}) for _ in range(count)]
    try:
        return {_LEVELS[(await c.exec_driver_sql("PRAGMA synchronous")).scalar_one()] for c in connections}
    finally:
        for connection in connections:
            await connection.close()


def test_the_default_is_full() -> None:
    """A committed checkpoint must survive a power failure unless the operator says otherwise."""
    assert ServiceSettings().database.sqlite_synchronous == "full"


@pytest.mark.parametrize("level", ["full", "normal"])
async def test_every_connection_of_a_service_engine_uses_the_configured_level(tmp_path: Path, level: str) -> None:
    """`Service.open` passes the setting to the engine; every connection it opens, the step commit's included
    (they share the pool), runs with it."""
    settings = ServiceSettings(database={"url": f"sqlite:///{tmp_path / 'x.db'}", "sqlite_synchronous": level})
    service = await Service.open(settings, runs_worker=True)
    try:
        assert await _levels_of_pooled_connections(service.engine) == {level}
    finally:
        await service.close()


def test_the_engine_default_is_full_for_code_that_opens_its_own(tmp_path: Path) -> None:
    """`create_engine` without the argument (migrations, tools) keeps `full`."""
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        assert asyncio.run(_levels_of_pooled_connections(engine, count=1)) == {"full"}
    finally:
        asyncio.run(engine.dispose())


@pytest.mark.parametrize("value", ["off", "extra", "NORMAL ; DROP TABLE runs", ""])
def test_other_levels_are_refused_naming_the_field(value: str) -> None:
    """S-124: `off` (an OS crash could corrupt the database) and anything else is refused at startup, the message
    naming the field; from the environment as from TOML."""
    with pytest.raises(ValidationError) as caught:
        ServiceSettings(database={"sqlite_synchronous": value})
    assert "sqlite_synchronous" in str(caught.value)


def test_the_environment_sets_it() -> None:
    """§3.1: `CANDOR_DATABASE__SQLITE_SYNCHRONOUS`, a known variable (S-124 refuses unknown ones)."""
    loaded = ServiceSettings.load(environ={"CANDOR_DATABASE__SQLITE_SYNCHRONOUS": "normal"})
    assert loaded.database.sqlite_synchronous == "normal"


def test_the_connection_hook_refuses_an_unchecked_level(tmp_path: Path) -> None:
    """The level is interpolated into the PRAGMA, so the hook itself refuses anything but the two levels, whoever
    calls it."""
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with pytest.raises(ValueError, match="unknown SQLite synchronous level"):
            install_connection_hooks(engine, timeout=1.0, sqlite_synchronous="off")  # type: ignore[arg-type]
    finally:
        asyncio.run(engine.dispose())


@pytest.mark.parametrize("level", ["full", "normal"])
async def test_a_process_on_sqlite_with_normal_warns_at_startup(db: Any, caplog: Any, level: str) -> None:
    """Durability relaxed by configuration is said once at startup, on SQLite; PostgreSQL ignores the setting and
    says nothing."""
    settings = ServiceSettings(database={"url": db.url, "sqlite_synchronous": level})
    with caplog.at_level(logging.WARNING, logger="candor.process"):
        service = await prepare(settings, "control")
    await service.close()
    warned = [r for r in caplog.records if "database.sqlite_synchronous is normal" in r.getMessage()]
    assert len(warned) == (1 if (level, db.kind) == ("normal", "sqlite") else 0)
