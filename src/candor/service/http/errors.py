"""HTTP error envelope: every failure becomes `{"error": {"code", "message", "details", "request_id"}}` (§8.1, §12.1).

The code → status table (`STATUS`) lives here and nowhere else (STYLE habit 10). A `ServiceError` gives its `code`
and `details`; request validation gives 400 `invalid_argument` with `details.fields` (at most 20), never 422, and
a body that is not JSON field `body`, reason `unparsable` (S-96); an unknown route or method gives 404
`not_found` with `details = {"kind": "route", "id": "<METHOD> <path>"}` (S-99); `StoreUnavailable` gives 503
`unavailable`, any other error 500 `internal`. Details never echo submitted values or secrets: ids and paths are
cut to 128 characters and lists to 128 items (`bounded_details`). Requests no route could take are refused in edge.py.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..errors import RateLimited, ServiceError, StoreUnavailable

__all__ = (
    "STATUS",
    "Unauthenticated",
    "PreconditionRequired",
    "PayloadTooLarge",
    "InvalidCursor",
    "MAX_ECHO",
    "BAD_CHARACTER",
    "bounded",
    "bounded_details",
    "request_id_of",
    "error_response",
    "service_error_response",
    "http_exception_response",
    "internal_error_response",
    "validation_fields",
    "handle_service_error",
    "handle_validation_error",
    "handle_http_exception",
)

log = logging.getLogger("candor.http")

STATUS: Mapping[str, int] = {
    "invalid_argument": 400,
    "invalid_cursor": 400,
    "unauthenticated": 401,
    "forbidden": 403,
    "not_found": 404,
    "already_exists": 409,
    "conflict": 409,
    "precondition_failed": 412,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "disabled": 422,
    "precondition_required": 428,
    "rate_limited": 429,
    "internal": 500,
    "unavailable": 503,
}
"""§12.1: `error.code` → HTTP status. Codes not listed here (internal service codes) answer 500 `internal`."""

_MAX_FIELDS = 20
MAX_ECHO = 128
"""Longest text an error's `details` repeats; longer text is cut and ends with `…` (ids, field paths, values)."""
_MAX_ECHO_ITEMS = 128
"""Most items of a list in `details` (a resume's missing ids are at most 128 anyway)."""
BAD_CHARACTER = re.compile("[\x00\ud800-\udfff]")
"""Characters no stored string may hold: NUL (PostgreSQL refuses it) and lone surrogates (not encodable)."""


def bounded(text: str, limit: int = MAX_ECHO) -> str:
    """`text` safe to repeat in an error: NULs and lone surrogates replaced, at most `limit` characters (`…` ends
    a cut one)."""
    clean = BAD_CHARACTER.sub("\ufffd", text)
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def bounded_details(value: Any) -> Any:
    """`details` with every string `bounded` and every list cut to 128 items: errors never repeat unbounded
    client values (a 100 KB id, a 10 000-id order)."""
    if isinstance(value, str):
        return bounded(value)
    if isinstance(value, Mapping):
        return {bounded(str(key)): bounded_details(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [bounded_details(item) for item in value[:_MAX_ECHO_ITEMS]]
    return value


class Unauthenticated(ServiceError):
    """401 `unauthenticated`: the bearer secret is missing or unknown (S-101); the secret is never echoed."""

    code: ClassVar[str] = "unauthenticated"

    def __init__(self) -> None:
        super().__init__("a valid bearer secret is required")
        self.details: dict[str, Any] = {}


class PreconditionRequired(ServiceError):
    """428 `precondition_required`: the request updates a resource and has no `If-Match` (S-97)."""

    code: ClassVar[str] = "precondition_required"

    def __init__(self) -> None:
        super().__init__("this request requires an If-Match header with the resource's ETag")
        self.details: dict[str, Any] = {"header": "If-Match"}


class PayloadTooLarge(ServiceError):
    """413 `payload_too_large`: the body exceeds `server.max_request_bytes`."""

    code: ClassVar[str] = "payload_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__("the request body is too large")
        self.details: dict[str, Any] = {"max_request_bytes": limit}


class InvalidCursor(ServiceError):
    """400 `invalid_cursor`: a cursor that is malformed or belongs to another collection, scope or filters (S-98)."""

    code: ClassVar[str] = "invalid_cursor"

    def __init__(self) -> None:
        super().__init__("the cursor does not belong to this list")
        self.details: dict[str, Any] = {"field": "cursor"}


def request_id_of(scope_or_request: Request | Mapping[str, Any]) -> str | None:
    """The request id the middleware stored in the ASGI scope's `state` (S-95)."""
    scope = scope_or_request.scope if isinstance(scope_or_request, Request) else scope_or_request
    state = scope.get("state") or {}
    return state.get("request_id")


def error_response(
    request_id: str | None,
    code: str,
    message: str,
    details: Mapping[str, Any] | None = None,
    *,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The §8.1 envelope with the status of `code` (unknown codes: 500 `internal`)."""
    if code not in STATUS:
        code, message, details = "internal", "internal error", {}
    body = {
        "error": {
            "code": code,
            "message": message,
            "details": bounded_details(dict(details or {})),
            "request_id": request_id,
        }
    }
    return JSONResponse(body, status_code=STATUS[code], headers=dict(headers or {}))


def service_error_response(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    request_id = request_id_of(request)
    if isinstance(exc, StoreUnavailable):
        # §8.1: connectivity failures name the dependency; the driver's message is not shown.
        log.warning("Request failed", extra={"request_id": request_id, "error": type(exc.__cause__).__name__})
        return error_response(request_id, "unavailable", "a dependency is unavailable", {"dependency": "database"})
    if exc.code not in STATUS:
        log.error("Request failed", exc_info=exc, extra={"request_id": request_id, "code": exc.code})
        return error_response(request_id, "internal", "internal error")
    headers = {"Retry-After": str(exc.retry_after_seconds)} if isinstance(exc, RateLimited) else None
    if exc.code == "unauthenticated":
        headers = {"WWW-Authenticate": "Bearer"}
    details = getattr(exc, "details", None)
    return error_response(request_id, exc.code, exc.message, details, headers=headers)


async def handle_service_error(request: Request, exc: Exception) -> JSONResponse:
    return service_error_response(request, exc)


def validation_fields(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """`[{"field", "reason"}]` from pydantic/FastAPI errors: dotted paths and reason codes, never input values."""
    fields: list[dict[str, str]] = []
    for error in errors:
        field, reason = _field_and_reason(tuple(error.get("loc") or ()), str(error.get("type") or "invalid"))
        problem = {"field": field, "reason": reason}
        if problem not in fields:
            fields.append(problem)
        if len(fields) == _MAX_FIELDS:
            break
    return fields


_REASONS = {
    "missing": "required",
    "extra_forbidden": "unknown_field",
    "json_invalid": "unparsable",
    "greater_than_equal": "out_of_range",
    "less_than_equal": "out_of_range",
}
"""Stable reason codes for the common pydantic error types; other types are passed through as their type name."""


def _field_and_reason(loc: tuple[Any, ...], kind: str) -> tuple[str, str]:
    if kind == "json_invalid":
        return "body", "unparsable"
    source, path = (loc[0], loc[1:]) if loc else ("body", ())
    parts = [str(part) for part in path]
    if source == "header" and parts:
        return "-".join(word.capitalize() for word in parts[0].split("-")), _REASONS.get(kind, kind)
    if source == "body" and not parts and kind not in _REASONS:
        return "body", "unparsable"  # a JSON body that is not an object, or a body that is not JSON at all
    return ".".join(parts) or str(source), _REASONS.get(kind, kind)


async def handle_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    fields = validation_fields(exc.errors())
    return error_response(request_id_of(request), "invalid_argument", "the request is invalid", {"fields": fields})


def http_exception_response(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors: an unknown route or method → 404 `route` (S-99); a body it could not read → 400."""
    request_id = request_id_of(request)
    if exc.status_code in (404, 405):
        route = f"{request.method} {request.url.path}"
        return error_response(request_id, "not_found", "no such route", {"kind": "route", "id": route})
    if exc.status_code == 413:
        return error_response(request_id, "payload_too_large", "the request body is too large")
    if exc.status_code == 400:  # FastAPI could not read the body at all
        unparsable = {"fields": [{"field": "body", "reason": "unparsable"}]}
        return error_response(request_id, "invalid_argument", "the request is invalid", unparsable)
    return error_response(request_id, "internal", "internal error")


async def handle_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return http_exception_response(request, exc)


def internal_error_response(request_id: str | None) -> JSONResponse:
    return error_response(request_id, "internal", "internal error")
