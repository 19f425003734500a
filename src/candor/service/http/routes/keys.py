"""`/v1/keys`: manage the workspace's principals (API keys) (§4.2, §8.3)."""

from __future__ import annotations

from fastapi import APIRouter

from ._common import ERRORS

__all__ = ("router",)

router = APIRouter(prefix="/v1/keys", tags=["keys"], responses=ERRORS)
