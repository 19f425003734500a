"""Structured logs of `candor serve` (`[log] level`, `format`): one line per event, on stderr.

candor logs with fixed messages and the facts in `extra` (`log.info("HTTP request", extra={"status": 201})`), so
a line is easy to search and to parse. `text` renders `time level logger message key=value …`; `json` one object
per line with `time`, `level`, `logger`, `message` and the extras. Values are ids, codes, counts and durations:
never message text, secrets or SQL parameters (the engines run with `hide_parameters=True`, so a driver error's
text holds the statement only).

Loggers: `candor.http` (a line per request: request id, method, route template, status, duration), `candor.admin`
(a line per admin write), `candor.worker` (attempt claimed / ended with its status), `candor.control` (lease
expired: a failover), `candor.process`, `candor.outbox`.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any, Final

from .settings import LogSettings

__all__ = ("configure_logging", "TextFormatter", "JsonFormatter", "extras_of")

_STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName", "color_message"}
"""Not extras: a `LogRecord`'s own attributes, and uvicorn's `color_message` (its message again, with ANSI colours)."""
_HANDLER_NAME: Final = "candor-serve"


def extras_of(record: logging.LogRecord) -> dict[str, Any]:
    """The `extra` fields a log call passed (everything that is not a standard `LogRecord` attribute)."""
    return {key: value for key, value in vars(record).items() if key not in _STANDARD and not key.startswith("_")}


def _time(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, separators=(",", ":"))
    return json.dumps(text) if (not text or any(c in text for c in ' "=\n')) else text


class TextFormatter(logging.Formatter):
    """`2026-01-01T00:00:00.000Z INFO candor.http HTTP request method=POST status=201 …`."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{key}={_text_value(value)}" for key, value in extras_of(record).items())
        line = f"{_time(record)} {record.levelname} {record.name} {record.getMessage()}"
        line = f"{line} {fields}" if fields else line
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(extras_of(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(settings: LogSettings, stream: IO[str] | None = None) -> logging.Handler:
    """Send candor's loggers to `stream` (stderr) at `settings.level` in `settings.format`; calling it again
    replaces the handler it installed. uvicorn's access log is left off: `candor.http` writes the request lines."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if settings.format == "json" else TextFormatter())
    level = getattr(logging, settings.level.upper())
    for name in ("candor", "uvicorn.error"):
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True
    return handler
