"""The read values the admin actions hand back (keys, subscriptions, deliveries), for callers above the store."""

from __future__ import annotations

from ..store.auth import CreatedKey, PrincipalRow
from ..store.subscriptions import DeliveryRow, SubscriptionRow

__all__ = ("CreatedKey", "DeliveryRow", "PrincipalRow", "SubscriptionRow")
