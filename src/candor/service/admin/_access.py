"""What every admin action shares: the re-check of `admin` inside the action's transaction and the audit log of
admin writes. (The check before the transaction is `protocol.requests.require(principal, "admin")`.)"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import Disabled, Forbidden
from ..protocol.authority import Principal, key_allows
from ..store import workspaces as auth

__all__ = ("recheck_admin", "audit")

log = logging.getLogger("candor.admin")


async def recheck_admin(conn: Any, principal: Principal, *, refuse_archived: bool) -> None:
    """Inside the write transaction: the caller's key is still enabled and holds `admin` (else 403), and, when
    `refuse_archived`, its workspace is not archived (422 `disabled`, S-128)."""
    facts = await auth.read_authority(conn, principal.id)
    if refuse_archived and facts.workspace_archived:
        raise Disabled(principal.workspace_id)
    if not key_allows(facts, "admin"):
        raise Forbidden("admin")


def audit(event: str, principal: Principal, **fields: Any) -> None:
    """One structured log line per committed admin write: a fixed message, the acting principal and ids only."""
    log.info(event, extra={"principal_id": principal.id, "workspace_id": principal.workspace_id, **fields})
