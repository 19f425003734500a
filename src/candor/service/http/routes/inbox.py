"""`/v1/threads/{thread_id}/inbox`: list, read, edit, withdraw and reorder inbox entries (§8.3, §8.5)."""

from __future__ import annotations

from fastapi import APIRouter

from ._common import ERRORS

__all__ = ("router",)

router = APIRouter(prefix="/v1/threads", tags=["inbox"], responses=ERRORS)
