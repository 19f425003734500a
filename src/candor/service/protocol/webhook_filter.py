"""(pure) Which subscriptions want a run event (§9.3): the event type is subscribed and the filter matches the run."""

from __future__ import annotations

from collections.abc import Mapping

from .json_types import RowLike

__all__ = ("subscription_wants",)


def subscription_wants(subscription: RowLike, event_type: str, run: RowLike) -> bool:
    """§9.3: `event_type` is among the subscription's `events`, and each non-null `filter` field (`agent`,
    `thread_id`) equals the run's."""
    events = subscription["events"]
    if not isinstance(events, (list, tuple)) or event_type not in events:
        return False
    wanted = subscription["filter"]
    if not isinstance(wanted, Mapping):
        return True  # no filter: every run matches
    return all(wanted.get(name) is None or wanted[name] == run[name] for name in ("agent", "thread_id"))
