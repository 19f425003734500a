"""(pure) Which subscriptions want a run event (§9.3): the event type is subscribed and the filter matches the run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ("subscription_wants",)


def subscription_wants(subscription: Mapping[Any, Any], event_type: str, run: Mapping[Any, Any]) -> bool:
    """§9.3: `event_type` is among the subscription's `events`, and each non-null `filter` field (`agent`,
    `thread_id`) equals the run's."""
    if event_type not in (subscription["events"] or ()):
        return False
    wanted = subscription["filter"] or {}
    return all(wanted.get(name) is None or wanted[name] == run[name] for name in ("agent", "thread_id"))
