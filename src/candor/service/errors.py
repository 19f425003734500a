"""The service error family: stable string codes (spec §12) for everything the service raises on purpose.

    ServiceError                 base; `code` is stable, the message is for people
    ├── SettingsError            invalid configuration or a failed startup check (S-56, S-124)
    ├── StoreUnavailable         the database could not be reached or timed out → 503 `unavailable`
    ├── CheckpointCorrupt        a digest mismatch while rebuilding a checkpoint (S-46) → seal `checkpoint_corrupt`
    ├── SchemaMismatch           the database schema is not this build's (S-122, §10.3)
    └── LeaseLost                internal: a fenced write found the lease gone (S-20); never a run outcome (S-22)

Foreign exceptions are translated where they enter (store/engine.py for driver errors) and chained with
`raise … from exc`. Messages never echo secrets or submitted values.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = (
    "ServiceError",
    "SettingsError",
    "StoreUnavailable",
    "CheckpointCorrupt",
    "SchemaMismatch",
    "LeaseLost",
)


class ServiceError(Exception):
    """Base of every deliberate service error; tests assert on `code`, never on the message."""

    code: ClassVar[str] = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SettingsError(ServiceError):
    """The configuration is invalid or unsafe; the process refuses to start (S-56, S-124)."""

    code: ClassVar[str] = "invalid_settings"


class StoreUnavailable(ServiceError):
    """The database failed as a dependency (connection refused or lost, lock or statement timeout)."""

    code: ClassVar[str] = "unavailable"


class CheckpointCorrupt(ServiceError):
    """A stored message body or envelope does not match its digest, or a checkpoint chain is broken (S-46)."""

    code: ClassVar[str] = "checkpoint_corrupt"


class SchemaMismatch(ServiceError):
    """The database schema differs from the one this build expects (S-122, §10.3)."""

    code: ClassVar[str] = "schema_mismatch"


class LeaseLost(ServiceError):
    """Internal: a fenced write found the lease no longer held (S-20). Never becomes a run outcome (S-22)."""

    code: ClassVar[str] = "lease_lost"

    def __init__(self, reason: str) -> None:
        super().__init__(f"lease lost: {reason}")
        self.reason = reason
