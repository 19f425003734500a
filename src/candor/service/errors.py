"""The service error family: stable string codes (spec §12) for everything the service raises on purpose.

`ServiceError` shows the tree with each class's HTTP status. Foreign exceptions are translated where they enter
(store/db/engine.py for driver errors) and chained with `raise … from exc`. Messages never echo secrets or submitted
values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

__all__ = (
    "ServiceError",
    "SettingsError",
    "StoreUnavailable",
    "CheckpointCorrupt",
    "SchemaMismatch",
    "LeaseLost",
    "FieldProblem",
    "InvalidArgument",
    "Forbidden",
    "NotSubmitter",
    "NotFound",
    "AlreadyExists",
    "Conflict",
    "PreconditionFailed",
    "Disabled",
    "RateLimited",
    "EntryTooLarge",
    "AlreadyBootstrapped",
    "RaceLost",
)


class ServiceError(Exception):
    """Base of every deliberate service error; tests assert on `code`, never on the message.

    ServiceError                 base; `code` is stable, the message is for people
    ├── SettingsError            invalid configuration or a failed startup check (S-56, S-124)
    ├── StoreUnavailable         the database could not be reached or timed out → 503 `unavailable`
    ├── CheckpointCorrupt        a digest mismatch while rebuilding a checkpoint (S-46) → seal `checkpoint_corrupt`
    ├── SchemaMismatch           the database schema is not this build's (S-122, §10.3)
    ├── LeaseLost                internal: a fenced write found the lease gone (S-20); never a run outcome (S-22)
    ├── InvalidArgument          400 `invalid_argument`: `details.fields`, or `details.reason` (resume coverage)
    ├── Forbidden                403 `forbidden`: the principal lacks the permission (S-101)
    │   └── NotSubmitter         403 `forbidden`: only an entry's submitter may edit or withdraw it (S-74)
    ├── NotFound                 404 `not_found`: unknown id, or an id of another workspace (S-126)
    ├── AlreadyExists            409 `already_exists`: a duplicate unique name
    ├── Conflict                 409 `conflict` with `details.reason` (§12.2), `kind` and `id`
    ├── PreconditionFailed       412 `precondition_failed`: stale `If-Match` (`details.current_etag`)
    ├── Disabled                 422 `disabled`: the workspace is archived (S-128)
    ├── RateLimited              429 `rate_limited`: the thread's inbox is full (S-73)
    ├── EntryTooLarge            413 `payload_too_large`: one message larger than the whole inbox may hold
    ├── AlreadyBootstrapped      `candor bootstrap` on a database that already has a workspace (S-130)
    └── RaceLost                 internal: a unique index rejected a racing write; the command answers again
    """

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


# --- request errors (spec §12.1); each carries the `details` of its error envelope -----------------------------

FieldProblem = tuple[str, str]
"""`(field, reason)` of one validation problem; rendered as `{"field", "reason"}` (at most 20, §8.1)."""

_MAX_FIELDS = 20


class InvalidArgument(ServiceError):
    """400 `invalid_argument`: `details.fields` for validation problems, or `details.reason` plus extra details."""

    code: ClassVar[str] = "invalid_argument"

    def __init__(
        self,
        message: str = "the request is invalid",
        *,
        fields: Sequence[FieldProblem] = (),
        reason: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.fields: tuple[FieldProblem, ...] = tuple(fields)
        self.reason = reason
        extra = dict(details or {})
        if self.fields:
            extra["fields"] = [{"field": field, "reason": why} for field, why in self.fields[:_MAX_FIELDS]]
        if reason is not None:
            extra["reason"] = reason
        self.details: dict[str, Any] = extra


class Forbidden(ServiceError):
    """403 `forbidden`: the principal lacks `permission`, or acts on another principal's entry."""

    code: ClassVar[str] = "forbidden"

    def __init__(self, permission: str) -> None:
        super().__init__(f"this key lacks the {permission!r} permission")
        self.permission = permission
        self.details: dict[str, Any] = {"permission": permission}


class NotSubmitter(Forbidden):
    """403 `forbidden`: the caller holds `run` but did not submit the inbox entry it edits or withdraws (S-74)."""

    def __init__(self, entry_id: str) -> None:
        super().__init__("run")
        self.message = "only the key that submitted the entry may edit or withdraw it"
        self.args = (self.message,)
        self.details = {"reason": "not_submitter", "kind": "entry", "id": entry_id}


class NotFound(ServiceError):
    """404 `not_found`: no such object in the caller's workspace (S-126: other workspaces' ids look unknown)."""

    code: ClassVar[str] = "not_found"

    def __init__(self, kind: str, id: str) -> None:  # noqa: A002 - the spec's detail name
        super().__init__(f"{kind} not found")
        self.kind = kind
        self.id = id
        self.details: dict[str, Any] = {"kind": kind, "id": id}


class AlreadyExists(ServiceError):
    """409 `already_exists`: an object with that unique name exists (the name is not echoed)."""

    code: ClassVar[str] = "already_exists"

    def __init__(self, kind: str) -> None:
        super().__init__(f"a {kind} with that name already exists")
        self.kind = kind
        self.details: dict[str, Any] = {"kind": kind}


class Conflict(ServiceError):
    """409 `conflict`: the state does not allow the request; `reason` is one of §12.2."""

    code: ClassVar[str] = "conflict"

    def __init__(self, reason: str, *, kind: str, id: str) -> None:  # noqa: A002 - the spec's detail name
        super().__init__(f"{kind} conflict: {reason}")
        self.reason = reason
        self.kind = kind
        self.id = id
        self.details: dict[str, Any] = {"reason": reason, "kind": kind, "id": id}


class PreconditionFailed(ServiceError):
    """412 `precondition_failed`: the `If-Match` ETag is stale (§8.1)."""

    code: ClassVar[str] = "precondition_failed"

    def __init__(self, current_etag: str) -> None:
        super().__init__("the resource has changed")
        self.current_etag = current_etag
        self.details: dict[str, Any] = {"current_etag": current_etag}


class Disabled(ServiceError):
    """422 `disabled`: the caller's workspace is archived (§4.4, S-128); reads keep working."""

    code: ClassVar[str] = "disabled"

    def __init__(self, workspace_id: str) -> None:
        super().__init__("the workspace is archived")
        self.workspace_id = workspace_id
        self.details: dict[str, Any] = {"kind": "workspace", "id": workspace_id}


class RateLimited(ServiceError):
    """429 `rate_limited`: the thread's pending plus assigned entries would exceed the inbox limits (S-73)."""

    code: ClassVar[str] = "rate_limited"
    retry_after_seconds: ClassVar[int] = 1

    def __init__(self, *, count: int, bytes: int, count_limit: int, bytes_limit: int) -> None:  # noqa: A002
        super().__init__("the thread's inbox is full")
        self.details: dict[str, Any] = {
            "count": count,
            "bytes": bytes,
            "count_limit": count_limit,
            "bytes_limit": bytes_limit,
            "retry_after_seconds": self.retry_after_seconds,
        }


class EntryTooLarge(ServiceError):
    """413 `payload_too_large`: one message is larger than `control.inbox_bytes`, so it could never fit the inbox
    (a 429 would invite retries that can never succeed)."""

    code: ClassVar[str] = "payload_too_large"

    def __init__(self, *, bytes: int, bytes_limit: int) -> None:  # noqa: A002
        super().__init__("the message is larger than a thread's inbox may hold")
        self.details: dict[str, Any] = {"field": "input", "bytes": bytes, "bytes_limit": bytes_limit}


class AlreadyBootstrapped(ServiceError):
    """`candor bootstrap` found a workspace: it refuses and changes nothing (S-130)."""

    code: ClassVar[str] = "already_bootstrapped"

    def __init__(self) -> None:
        super().__init__("the database already has a workspace; bootstrap changes nothing")


class RaceLost(ServiceError):
    """Internal: a unique index rejected this transaction's write because a concurrent one won (S-1, S-83, §8.2).

    The transaction is rolled back; the command answers again (a replay, or the state the winner left).
    """

    code: ClassVar[str] = "race_lost"

    def __init__(self, constraint: str | None) -> None:
        super().__init__(f"a concurrent request won on {constraint or 'a unique index'}")
        self.constraint = constraint
