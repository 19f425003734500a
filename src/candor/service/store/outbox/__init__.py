"""The outbox after staging (spec §9): claims and settlement, backlog and redelivery, subscriptions, and
checkpoint cleanup.

This is the face code outside `store/` imports; modules inside `store/` import each other directly.
"""

from __future__ import annotations

from .backlog import has_dead, purge, read_backlog, read_runs_backlog, redeliver
from .claims import ClaimedRow, Settlement, claim_rows, claim_rows_locked, settle_many, settle_many_locked
from .cleanup import cleanup_page_locked
from .subscriptions import (
    DeliveryRow,
    SubscriptionChanges,
    SubscriptionRow,
    count_subscriptions,
    delete_subscription,
    get_delivery,
    get_subscription,
    insert_subscription,
    list_deliveries,
    list_subscriptions,
    lock_subscription,
    update_subscription,
)

__all__ = (
    "ClaimedRow",
    "DeliveryRow",
    "Settlement",
    "SubscriptionChanges",
    "SubscriptionRow",
    "claim_rows",
    "claim_rows_locked",
    "cleanup_page_locked",
    "count_subscriptions",
    "delete_subscription",
    "get_delivery",
    "get_subscription",
    "has_dead",
    "insert_subscription",
    "list_deliveries",
    "list_subscriptions",
    "lock_subscription",
    "purge",
    "read_backlog",
    "read_runs_backlog",
    "redeliver",
    "settle_many",
    "settle_many_locked",
    "update_subscription",
)
