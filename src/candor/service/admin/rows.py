"""The read values the admin actions hand back (keys, subscriptions, deliveries), for callers above the store."""

from __future__ import annotations

from ..store.outbox import DeliveryRow, SubscriptionRow
from ..store.workspaces import CreatedKey, PrincipalRow

__all__ = ("CreatedKey", "DeliveryRow", "PrincipalRow", "SubscriptionRow")
