"""What every `/v1` route module shares: the permission dependencies, the error responses and the status of a
created-or-replayed answer (201 or 200, §8.2)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Response

from ..dependencies import Caller, authorized
from ..schemas import ErrorBody, etag

__all__ = ("Reader", "Runner", "Admin", "ERRORS", "created_or_replayed", "with_etag", "no_store")

Reader = Annotated[Caller, Depends(authorized("read"))]
"""A caller holding `read` (every GET, §4.2)."""
Runner = Annotated[Caller, Depends(authorized("run"))]
"""A caller holding `run` (thread and run commands, §4.2)."""
Admin = Annotated[Caller, Depends(authorized("admin"))]
"""A caller holding `admin` (keys and subscriptions, §4.2)."""

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in (
        (400, "invalid_argument or invalid_cursor"),
        (401, "unauthenticated"),
        (403, "forbidden"),
        (404, "not_found"),
        (503, "unavailable"),
    )
}
"""Error answers common to every `/v1` route (documented in the OpenAPI schema; never 422)."""


def created_or_replayed(response: Response, created: bool) -> None:
    """201 when the request created the resources, 200 when it replayed an earlier request (§8.2)."""
    response.status_code = 201 if created else 200


def with_etag(response: Response, id: str, version: int) -> None:  # noqa: A002 - the spec's word
    response.headers["ETag"] = etag(id, version)


def no_store(response: Response) -> None:
    """A response that carries a secret must not be kept by any cache (RFC 9111 `no-store`)."""
    response.headers["Cache-Control"] = "no-store"
