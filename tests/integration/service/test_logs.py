"""Structured logs of `candor serve` (`[log]`, issue 14): text and JSON lines with the call's extras; SQL
parameters never reach a log line."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest
from sqlalchemy import text

from candor.service.logs import configure_logging
from candor.service.settings import LogSettings
from candor.service.store.db.engine import create_engine


def test_json_lines_carry_the_extras(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging(LogSettings(level="info", format="json"), stream)
    logging.getLogger("candor.admin").info("Key created", extra={"principal_id": "key_1", "permissions": ["read"]})
    logging.getLogger("candor.worker").debug("hidden below the level")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["message"] == "Key created" and entry["logger"] == "candor.admin" and entry["level"] == "INFO"
    assert entry["principal_id"] == "key_1" and entry["permissions"] == ["read"] and entry["time"].endswith("Z")


def test_text_lines_are_key_value_and_reconfiguring_replaces_the_handler(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging(LogSettings(level="debug", format="json"), io.StringIO())
    configure_logging(LogSettings(level="debug", format="text"), stream)
    logging.getLogger("candor.http").info(
        "HTTP request", extra={"route": "/v1/threads", "status": 201, "note": "two words"}
    )
    (line,) = stream.getvalue().splitlines()
    assert line.split(" ", 1)[1] == 'INFO candor.http HTTP request route=/v1/threads status=201 note="two words"'


async def test_database_errors_never_show_parameters(tmp_path: Any) -> None:
    """Statement parameters hold message text and secret hashes: a driver error shows the SQL only."""
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        async with engine.connect() as conn:
            await conn.execute(text("CREATE TABLE t (v TEXT UNIQUE)"))
            await conn.execute(text("INSERT INTO t VALUES (:v)"), {"v": "top-secret-value"})
            with pytest.raises(Exception) as caught:
                await conn.execute(text("INSERT INTO t VALUES (:v)"), {"v": "top-secret-value"})
    finally:
        await engine.dispose()
    assert "top-secret-value" not in str(caught.value)


def test_uvicorn_writes_no_access_line_of_its_own_and_keeps_candors_handlers(
    restore_logging: None, capsys: Any
) -> None:
    """One line per request, `candor.http`'s: the HTTP server's settings turn uvicorn's access log off and leave
    the logging `configure_logging` set up in place (uvicorn's default `log_config` re-enabled its access logger
    and wrote every request again, to stdout)."""
    from candor.service.process import http_config

    stream = io.StringIO()
    handler = configure_logging(LogSettings(level="info", format="text"), stream)
    config = http_config(object(), host="127.0.0.1", port=0, http_parser="h11")
    assert config.access_log is False
    assert handler in logging.getLogger("uvicorn.error").handlers
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:1", "GET", "/healthz", "1.1", 200)
    logging.getLogger("uvicorn.error").info("Started server process", extra={"color_message": "\x1b[36mStarted"})
    assert capsys.readouterr().out == ""
    (line,) = stream.getvalue().splitlines()
    assert line.endswith("INFO uvicorn.error Started server process")  # uvicorn's coloured copy left out
