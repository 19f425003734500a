"""Request dependencies: the service, the authenticated caller (§4.2) and the `If-Match` precondition (§8.1).

`authorized(permission)` authenticates the bearer secret (401 `unauthenticated` when missing or unknown, S-101) and
checks the permission of the route (`read` for every GET, `run` for thread and run commands; 403 `forbidden`). It
runs before the body is validated, so §8.2's order holds: authenticate and authorize → replay → state. An archived
workspace still authenticates (reads keep working, S-128); the commands answer its writes with 422 `disabled`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .. import commands
from ..core import Service
from ..errors import Forbidden
from ..protocol.authority import Permission, Principal
from .errors import PreconditionRequired, Unauthenticated

__all__ = ("Caller", "authorized", "service_of", "IdempotencyKey", "IfMatch", "expected_version")

_bearer = HTTPBearer(auto_error=False, description="An API key secret: `Authorization: Bearer cnd_…`.")


def service_of(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


@dataclass(frozen=True, kw_only=True, slots=True)
class Caller:
    """The authenticated principal of a request, with the service it acts on."""

    service: Service
    principal: Principal
    workspace_archived: bool


def authorized(permission: Permission) -> Callable[..., Awaitable[Caller]]:
    """A dependency that authenticates the caller and requires `permission` (§4.2)."""

    async def caller(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> Caller:
        service = service_of(request)
        if credentials is None:
            raise Unauthenticated()
        found = await commands.authenticate(service, credentials.credentials)
        if found is None:
            raise Unauthenticated()
        if not found.principal.can(permission):
            raise Forbidden(permission)
        return Caller(service=service, principal=found.principal, workspace_archived=found.workspace_archived)

    return caller


IdempotencyKey = Annotated[
    str,
    Header(
        alias="Idempotency-Key",
        description="Required: 1–512 visible ASCII characters. A repeat with the same body answers 200 (§8.2).",
    ),
]
"""Absent → 400 (field `Idempotency-Key`, reason `required`); otherwise passed to the command as given, which
answers 400 for an empty, too long or non-visible-ASCII key (S-93)."""

IfMatch = Annotated[
    str | None, Header(alias="If-Match", description='Required: the resource\'s current ETag, `"{id}:{version}"`.')
]

_ETAG = re.compile(r'\A"(?P<id>[a-z]+_[0-9a-f]{32}):(?P<version>[0-9]{1,18})"\Z')


def expected_version(if_match: str | None, resource_id: str) -> int:
    """The version an exact `If-Match` names; missing → 428 (S-97). A value naming another resource, or one that
    is not an ETag of ours, can never match: it reads as version -1 and the command answers 412 with the current
    ETag."""
    if if_match is None or not if_match.strip():
        raise PreconditionRequired()
    match = _ETAG.match(if_match.strip())
    if match is None or match["id"] != resource_id:
        return -1
    return int(match["version"])
