"""Typed errors of `candor.client`, mapped from the service's error envelope (spec §8.1, §12.1).

Every error answer of the API is `{"error": {"code", "message", "details", "request_id"}}`. The client raises one
exception class per family of `code`, each carrying `.code`, `.status`, `.details`, `.request_id` (and
`.reason`, `details["reason"]` when present), so a program can catch `Conflict` and look at `.reason`.

Local errors (nothing was sent) are `IncompleteBatch` for a resume batch that does not answer every pending item,
and `WaitTimeout` when a run did not reach the awaited state in time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = (
    "CandorError",
    "ApiError",
    "InvalidArgument",
    "Unauthenticated",
    "Forbidden",
    "NotFound",
    "Conflict",
    "PreconditionFailed",
    "PayloadTooLarge",
    "Disabled",
    "RateLimited",
    "ServerError",
    "Unavailable",
    "TransportFailed",
    "IncompleteBatch",
    "WaitTimeout",
    "error_for",
)


class CandorError(Exception):
    """Base of every error `candor.client` raises."""


class ApiError(CandorError):
    """The service answered an error envelope (or an error status without one)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int,
        details: Mapping[str, Any] | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" ({request_id})" if request_id else ""))
        self.code = code
        self.message = message
        self.status = status
        self.details: dict[str, Any] = dict(details or {})
        self.request_id = request_id
        self.retry_after = retry_after

    @property
    def reason(self) -> str | None:
        """`details.reason` (409 `conflict` reasons, resume coverage mismatches), if any."""
        reason = self.details.get("reason")
        return reason if isinstance(reason, str) else None


class InvalidArgument(ApiError):
    """400 `invalid_argument` or `invalid_cursor` (`details.fields`, or a resume `pending_coverage_mismatch`)."""


class Unauthenticated(ApiError):
    """401: missing, unknown or disabled key."""


class Forbidden(ApiError):
    """403: the key lacks the permission (`details.permission`) or did not post the entry (`not_submitter`)."""


class NotFound(ApiError):
    """404: unknown object, one of another workspace, or an unknown route (`details.kind`, `details.id`)."""


class Conflict(ApiError):
    """409 `conflict` (see `.reason`) or `already_exists`."""


class PreconditionFailed(ApiError):
    """412 `precondition_failed` (`details.current_etag`) or 428 `precondition_required`."""


class PayloadTooLarge(ApiError):
    """413: the body is over the server's `server.max_request_bytes`."""


class Disabled(ApiError):
    """422 `disabled`: the workspace is archived."""


class RateLimited(ApiError):
    """429: the thread's inbox is full; `.retry_after` seconds (from `Retry-After`)."""


class ServerError(ApiError):
    """500 `internal`: a bug in the service; quote `.request_id`."""


class Unavailable(ApiError):
    """503 `unavailable`: a dependency (the database) is unreachable; retry later."""


class TransportFailed(CandorError):
    """The request never got an answer (connection refused or reset, timeout) after every retry."""


class IncompleteBatch(CandorError):
    """A resume batch that does not answer exactly the pending items; nothing was sent."""

    def __init__(self, missing: Sequence[str], unexpected: Sequence[str] = ()) -> None:
        parts = []
        if missing:
            parts.append(f"no answer for {', '.join(missing)}")
        if unexpected:
            parts.append(f"answers for items that are not pending: {', '.join(unexpected)}")
        super().__init__("the resume batch must answer every pending item: " + "; ".join(parts))
        self.missing = list(missing)
        self.unexpected = list(unexpected)


class WaitTimeout(CandorError, TimeoutError):
    """The run did not reach the awaited state in time; `.run` is its last view."""

    def __init__(self, run_id: str, run: Any) -> None:
        super().__init__(f"run {run_id} is still {getattr(run, 'status', '?')}")
        self.run = run


_BY_CODE: Mapping[str, type[ApiError]] = {
    "invalid_argument": InvalidArgument,
    "invalid_cursor": InvalidArgument,
    "unauthenticated": Unauthenticated,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "already_exists": Conflict,
    "precondition_failed": PreconditionFailed,
    "precondition_required": PreconditionFailed,
    "payload_too_large": PayloadTooLarge,
    "disabled": Disabled,
    "rate_limited": RateLimited,
    "internal": ServerError,
    "unavailable": Unavailable,
}
_BY_STATUS: Mapping[int, type[ApiError]] = {
    400: InvalidArgument,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    412: PreconditionFailed,
    413: PayloadTooLarge,
    422: Disabled,
    428: PreconditionFailed,
    429: RateLimited,
    503: Unavailable,
}


def error_for(status: int, body: Any, *, retry_after: float | None = None) -> ApiError:
    """The typed error of an error answer: by `error.code` when the body is the envelope, else by status (a proxy's
    502 page, say, becomes `ServerError` with code `http_<status>`)."""
    envelope = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(envelope, Mapping) and isinstance(envelope.get("code"), str):
        code = envelope["code"]
        cls = _BY_CODE.get(code) or _BY_STATUS.get(status) or ServerError
        details = envelope.get("details")
        request_id = envelope.get("request_id")
        return cls(
            code,
            str(envelope.get("message") or code),
            status=status,
            details=details if isinstance(details, Mapping) else None,
            request_id=request_id if isinstance(request_id, str) else None,
            retry_after=retry_after,
        )
    cls = _BY_STATUS.get(status) or ServerError
    return cls(
        f"http_{status}",
        "the server answered an error without the error envelope",
        status=status,
        retry_after=retry_after,
    )
