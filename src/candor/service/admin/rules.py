"""Pure checks and decisions of the admin actions (§4.2, §9.3, §9.4): names, event types, filters, webhook
targets, list limits, and the rule that keeps every workspace manageable (its last enabled admin key stays).

Every function either returns the normalised value or raises `InvalidArgument` naming the field; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from ..errors import InvalidArgument
from ..outbox.webhooks import target_allowed
from ..protocol.requests import NAME_LIMIT, checked_limit, checked_name

__all__ = (
    "EventType",
    "EVENT_TYPES",
    "FILTER_FIELDS",
    "NAME_LIMIT",
    "URL_LIMIT",
    "checked_limit",
    "checked_name",
    "checked_url",
    "checked_events",
    "checked_filter",
    "removes_last_admin",
)

# Hand layout: one line per lifecycle (the run's, then the attempt's), in the order they happen.
EventType = Literal[
    "run.accepted", "run.running", "run.waiting", "run.completed", "run.failed", "run.cancelled",
    "run_attempt.leased", "run_attempt.running", "run_attempt.succeeded", "run_attempt.yielded",
    "run_attempt.failed", "run_attempt.cancelled",
]  # fmt: skip
"""§9.3: the event types a subscription can list."""
EVENT_TYPES: frozenset[str] = frozenset(get_args(EventType))
FILTER_FIELDS = ("agent", "thread_id")
"""§9.3: a subscription's optional `filter`; a run matches when every given field equals the run's."""
URL_LIMIT = 2048


def checked_url(url: Any, *, allow_insecure: bool) -> str:
    """§9.4: the outbound policy at subscription write: `https://` with a host (`http://` too when
    `control.webhook_allow_insecure`), at most 2048 characters; otherwise field `url`, reason `target_refused`."""
    if not isinstance(url, str) or len(url) > URL_LIMIT or not target_allowed(url, allow_insecure=allow_insecure):
        raise InvalidArgument(fields=[("url", "target_refused")])
    return url


def checked_events(events: Any) -> list[str]:
    """At least one §9.3 event type; duplicates collapse, order is kept."""
    if isinstance(events, str) or not isinstance(events, Sequence) or not events:
        raise InvalidArgument(fields=[("events", "required")])
    if not all(isinstance(event, str) and event in EVENT_TYPES for event in events):
        raise InvalidArgument(fields=[("events", "unknown_event")])
    return list(dict.fromkeys(events))


def checked_filter(value: Any) -> dict[str, str]:
    """§9.3: `{agent?, thread_id?}`, each a non-empty string; null fields are dropped (they match every run)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not set(value) <= set(FILTER_FIELDS):
        raise InvalidArgument(fields=[("filter", "invalid")])
    chosen = {name: field for name, field in value.items() if field is not None}
    for name, field in chosen.items():
        if not isinstance(field, str) or not field:
            raise InvalidArgument(fields=[(f"filter.{name}", "invalid")])
    return chosen


def removes_last_admin(
    *,
    is_enabled_admin: bool,
    permissions: Sequence[str] | None,
    disabled: bool | None,
    enabled_admins: int,
) -> bool:
    """Whether a key change would leave its workspace with no enabled `admin` key.

    The change takes `admin` away when it disables an enabled admin key or sets permissions without `admin`;
    that is refused only when this key is the workspace's last enabled admin key. Such a workspace could no longer
    manage keys or subscriptions over HTTP (only the operator's `candor key create` could repair it), so an admin
    cannot lock everyone out by accident, including by disabling their own key.
    """
    if not is_enabled_admin:
        return False
    takes_admin_away = disabled is True or (permissions is not None and "admin" not in permissions)
    return takes_admin_away and enabled_admins <= 1
