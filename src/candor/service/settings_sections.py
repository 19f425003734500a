"""The sections of the service settings (spec §3.2): server, database, worker, control, outbox, log, security.

Every section forbids unknown keys (S-124) and is frozen. Durations are float seconds and byte sizes are ints. The
`[agents.<name>]` sections are in settings_agents.py; `ServiceSettings` (settings.py) puts them together.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

__all__ = (
    "KiB",
    "MiB",
    "Section",
    "ServerSettings",
    "DatabaseSettings",
    "WorkerSettings",
    "ControlSettings",
    "OutboxKind",
    "OUTBOX_KINDS",
    "OutboxKindPolicy",
    "OutboxKindOverride",
    "SHIPPED_OUTBOX_OVERRIDES",
    "OutboxSettings",
    "LogSettings",
    "SecuritySettings",
    "TelemetrySettings",
)

KiB = 1024
MiB = 1024 * KiB

OutboxKind = Literal["webhook", "child_result", "checkpoint_cleanup"]
OUTBOX_KINDS: tuple[OutboxKind, ...] = get_args(OutboxKind)


class Section(BaseModel):
    """A settings section: unknown keys refused (S-124), frozen, defaults validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ServerSettings(Section):
    """`[server]`: the HTTP listener."""

    listen: str = "127.0.0.1:8080"
    """HTTP listen address, `host:port`."""
    readiness_timeout: float = Field(2.0, gt=0)
    """Limit for the schema check behind `/readyz`."""
    shutdown_timeout: float = Field(15.0, gt=0)
    """Time allowed for a graceful stop."""
    max_request_bytes: int = Field(8 * MiB, ge=1)
    """Larger request bodies answer 413."""
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """The event loop `candor serve` runs on: uvloop (libuv; less CPU per request and per database round trip) or
    the standard library's asyncio loop."""
    http_parser: Literal["httptools", "h11"] = "httptools"
    """uvicorn's HTTP/1.1 implementation: httptools (C parser) or h11 (pure Python)."""

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("must be host:port with a port between 1 and 65535")
        return value


class DatabaseSettings(Section):
    """`[database]`: the backend (§2.2) and its migrations (§10.3)."""

    url: str = Field("sqlite:///candor.db", min_length=1)
    """`sqlite:///path` or `postgresql://…`."""
    auto_migrate: bool = True
    """`control` and `all` processes migrate at startup."""
    migration_lock_timeout: float = Field(900.0, gt=0)
    """Longest wait for the migration lock."""
    timeout: float = Field(5.0, gt=0)
    """Statement timeout; also the safety margin before a lease deadline (S-25)."""
    pool_size: int | None = Field(None, ge=1, le=1000)
    """PostgreSQL connections each process keeps open in its pool (SQLite ignores it). Unset: 10, whatever the role
    and `worker.slots`: a run in flight holds a connection only while one of its statements runs (§7.8.1)."""
    max_overflow: int = Field(4, ge=0, le=1000)
    """PostgreSQL connections a process may open beyond `pool_size` under load; each is closed again when it is
    returned while the pool is full, so a busy process that keeps needing them pays a new connection every time."""
    processes: int | None = Field(None, ge=1, le=10000)
    """candor processes of every role sharing this PostgreSQL database, for the startup check that their connection
    budgets fit the server's `max_connections` (store/db/connections.py). Unset: estimated from the candor processes
    connected when this one starts."""
    sqlite_synchronous: Literal["full", "normal"] = "full"
    """SQLite's `PRAGMA synchronous` (PostgreSQL ignores it). `full`: every commit is on disk before it returns, so
    a committed checkpoint, seal or accepted request survives a power failure. `normal`: a commit is safe from a
    crash of the process, but the last commits before a power failure or OS crash may be lost (the database stays
    consistent), and with them the record of a tool call, which may then run again; in exchange the worker does
    not wait for a disk flush at every boundary (docs/operations.md)."""


class WorkerSettings(Section):
    """`[worker]`: claiming, leases, checkpoints and streams."""

    slots: int = Field(64, ge=1, le=4096)
    """Concurrent attempts per worker; bounded by memory, not by connections (§7.8.1)."""
    max_attempts: int = Field(3, ge=1, le=20)
    """Charged attempts per run; copied onto each run at acceptance (S-10)."""
    lease_seconds: float = Field(30.0, ge=3, le=300)
    scan_seconds: float = Field(1.0, gt=0, le=30)
    authority_seconds: float = Field(1.0, gt=0, le=30)
    """Supervisor heartbeat period; also the `expire_leases` period."""
    drain_seconds: float = Field(10.0, ge=0, le=300)
    delivery_count: int = Field(8, ge=1)
    delivery_bytes: int = Field(256 * KiB, ge=1 * KiB)
    output_bytes: int = Field(1 * MiB, ge=1)
    envelope_bytes: int = Field(1 * MiB, ge=1)
    stream_length: int = Field(10000, ge=1)
    stream_ttl: float = Field(600.0, gt=0)
    stream_coalesce_seconds: float = Field(0.1, ge=0)
    stream_trim_seconds: float = Field(10.0, gt=0)
    child_depth: int = Field(4, ge=0)
    child_count: int = Field(16, ge=0)


class ControlSettings(Section):
    """`[control]`: sweeps, inbox limits and webhooks."""

    scan_seconds: float = Field(1.0, gt=0)
    """Period of `advance_threads` and `deliver_outbox`."""
    sweep_batch: int = Field(100, ge=1)
    inbox_count: int = Field(128, ge=1)
    inbox_bytes: int = Field(2 * MiB, ge=1)
    subscriptions: int = Field(32, ge=0)
    webhook_timeout: float = Field(10.0, gt=0)
    webhook_allow_insecure: bool = False


class OutboxKindPolicy(Section):
    """The per-kind outbox policy of §9.8 with its defaults and bounds (`[outbox.defaults]`)."""

    max_attempts: int = Field(12, ge=1, le=100)
    batch: int = Field(32, ge=1)
    parallel: int = Field(8, ge=1)
    lease_seconds: float = Field(60.0, ge=10, le=600)
    backlog_count: int = Field(10000, ge=1)
    backlog_age_seconds: float = Field(300.0, gt=0)
    backlog_alert_seconds: float = Field(300.0, ge=0)
    delivered_retention_seconds: float = Field(86400.0, ge=0)
    dead_retention_seconds: float = Field(1209600.0, ge=0)


class OutboxKindOverride(Section):
    """`[outbox.by_kind.<kind>]`: the fields set here replace the defaults for that kind; same bounds."""

    max_attempts: int | None = Field(None, ge=1, le=100)
    batch: int | None = Field(None, ge=1)
    parallel: int | None = Field(None, ge=1)
    lease_seconds: float | None = Field(None, ge=10, le=600)
    backlog_count: int | None = Field(None, ge=1)
    backlog_age_seconds: float | None = Field(None, gt=0)
    backlog_alert_seconds: float | None = Field(None, ge=0)
    delivered_retention_seconds: float | None = Field(None, ge=0)
    dead_retention_seconds: float | None = Field(None, ge=0)

    def set_values(self) -> dict[str, Any]:
        return {name: value for name, value in self.model_dump().items() if value is not None}


SHIPPED_OUTBOX_OVERRIDES: Mapping[OutboxKind, Mapping[str, Any]] = {
    "webhook": {"delivered_retention_seconds": 604800.0},
    "child_result": {},
    "checkpoint_cleanup": {"delivered_retention_seconds": 3600.0, "parallel": 2},
}
"""§9.8 shipped overrides: applied over `outbox.defaults`, below any configured `outbox.by_kind` value."""


class OutboxSettings(Section):
    """`[outbox]`: purge pacing plus per-kind policy (§9.8)."""

    purge_interval_seconds: float = Field(60.0, gt=0)
    purge_batch: int = Field(1000, ge=1)
    purge_budget_seconds: float = Field(5.0, gt=0)
    defaults: OutboxKindPolicy = Field(default_factory=OutboxKindPolicy)
    by_kind: dict[OutboxKind, OutboxKindOverride] = Field(default_factory=dict)
    """Configured overrides only; an unknown kind fails validation (S-124)."""

    def policy(self, kind: OutboxKind) -> OutboxKindPolicy:
        """The effective policy of `kind`: defaults, then shipped overrides, then configured ones."""
        if kind not in OUTBOX_KINDS:
            raise KeyError(kind)
        values = self.defaults.model_dump()
        values.update(SHIPPED_OUTBOX_OVERRIDES[kind])
        configured = self.by_kind.get(kind)
        if configured is not None:
            values.update(configured.set_values())
        return OutboxKindPolicy.model_validate(values)


class LogSettings(Section):
    """`[log]`: what `candor serve` writes to stderr: one line per HTTP request, admin write and attempt event."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"
    """`text`: `time level logger message key=value …`; `json`: one JSON object per line."""


class SecuritySettings(Section):
    """`[security]`: the key ring for webhook signing secrets (Fernet keys; first encrypts, all decrypt)."""

    keys: tuple[SecretStr, ...] = ()

    @field_validator("keys")
    @classmethod
    def _fernet_keys(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for position, key in enumerate(value):
            try:
                raw = base64.urlsafe_b64decode(key.get_secret_value().encode("ascii"))
            except (binascii.Error, UnicodeEncodeError, ValueError):
                raw = b""
            if len(raw) != 32:
                # The message names the position only: a key never appears in an error.
                raise ValueError(f"key {position} is not url-safe base64 of 32 bytes (a Fernet key)")
        return value


class TelemetrySettings(Section):
    """`[telemetry]`: OpenTelemetry traces of runs (docs/telemetry.md), exported over OTLP/HTTP to the endpoint of
    the standard `OTEL_EXPORTER_OTLP_*` variables. Needs the `telemetry` extra (`pip install 'candor[telemetry]'`)."""

    enabled: bool = False
    service_name: str = Field("candor", min_length=1)
    """`service.name` of every span this process exports (`OTEL_RESOURCE_ATTRIBUTES` may add other attributes)."""
