"""`/v1/subscriptions`: webhook subscriptions, their deliveries and redelivery (§8.3, §9.4, §9.7)."""

from __future__ import annotations

from fastapi import APIRouter

from ._common import ERRORS

__all__ = ("router",)

router = APIRouter(prefix="/v1/subscriptions", tags=["subscriptions"], responses=ERRORS)
