"""The pure checks of the admin actions (§4.2, §9.3, §9.4): names, events, filters, targets, limits, last admin."""

from __future__ import annotations

from typing import Any

import pytest

from candor.service.admin.rules import (
    EVENT_TYPES,
    checked_events,
    checked_filter,
    checked_limit,
    checked_name,
    checked_url,
    removes_last_admin,
)
from candor.service.errors import InvalidArgument


def _problem(call: Any) -> tuple[str, str]:
    with pytest.raises(InvalidArgument) as caught:
        call()
    (problem,) = caught.value.fields
    return problem


def test_event_types_are_the_twelve_of_the_spec() -> None:
    """§9.3: six run events and six attempt events."""
    assert len(EVENT_TYPES) == 12
    assert {event.split(".")[0] for event in EVENT_TYPES} == {"run", "run_attempt"}


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        (["run.accepted"], ["run.accepted"]),
        (["run.failed", "run.accepted", "run.failed"], ["run.failed", "run.accepted"]),
        ([], ("events", "required")),
        ("run.accepted", ("events", "required")),
        (None, ("events", "required")),
        (["run.exploded"], ("events", "unknown_event")),
        (["run.accepted", 3], ("events", "unknown_event")),
    ],
)
def test_events(events: Any, expected: Any) -> None:
    """§9.3, S-96: at least one known event type (else 400 naming `events`); duplicates collapse in order."""
    if isinstance(expected, tuple):
        assert _problem(lambda: checked_events(events)) == expected
    else:
        assert checked_events(events) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, {}),
        ({}, {}),
        ({"agent": "support"}, {"agent": "support"}),
        ({"agent": None, "thread_id": "thr_1"}, {"thread_id": "thr_1"}),
        ({"tenant": "x"}, ("filter", "invalid")),
        (["agent"], ("filter", "invalid")),
        ({"agent": ""}, ("filter.agent", "invalid")),
        ({"thread_id": 7}, ("filter.thread_id", "invalid")),
    ],
)
def test_filter(value: Any, expected: Any) -> None:
    """§9.3, S-96: `filter` is `{agent?, thread_id?}` with non-empty strings (else 400 naming the field); nulls
    match every run."""
    if isinstance(expected, tuple):
        assert _problem(lambda: checked_filter(value)) == expected
    else:
        assert checked_filter(value) == expected


@pytest.mark.parametrize(
    ("url", "allow_insecure", "allowed"),
    [
        ("https://hooks.example.com/candor", False, True),
        ("http://hooks.example.com/candor", False, False),
        ("http://127.0.0.1:8080/hook", True, True),
        ("ftp://hooks.example.com", True, False),
        ("https://", False, False),
        ("https://example.com/" + "a" * 2048, False, False),
        (None, True, False),
    ],
)
def test_url_policy_at_write(url: Any, allow_insecure: bool, allowed: bool) -> None:
    """§9.4, S-96: `https://` only unless `control.webhook_allow_insecure`; a refused target is a 400 naming `url`."""
    if allowed:
        assert checked_url(url, allow_insecure=allow_insecure) == url
    else:
        assert _problem(lambda: checked_url(url, allow_insecure=allow_insecure)) == ("url", "target_refused")


@pytest.mark.parametrize(("name", "ok"), [("hooks", True), ("", False), ("   ", False), ("x" * 201, False), (3, False)])
def test_name(name: Any, ok: bool) -> None:
    """§5.1, S-96: a label of 1–200 characters (else 400 naming `name`)."""
    if ok:
        assert checked_name(name) == name
    else:
        assert _problem(lambda: checked_name(name)) == ("name", "invalid")


@pytest.mark.parametrize(("limit", "ok"), [(1, True), (100, True), (0, False), (101, False)])
def test_limit(limit: int, ok: bool) -> None:
    """S-98: a `limit` outside 1–100 → 400."""
    if ok:
        assert checked_limit(limit) == limit
    else:
        assert _problem(lambda: checked_limit(limit)) == ("limit", "out_of_range")


@pytest.mark.parametrize(
    ("is_enabled_admin", "permissions", "disabled", "enabled_admins", "refused"),
    [
        (True, None, True, 1, True),  # the last admin disables itself
        (True, ["read", "run"], None, 1, True),  # the last admin drops `admin`
        (True, ["admin"], False, 1, False),  # keeps admin and stays enabled
        (True, None, None, 1, False),  # no change
        (True, None, True, 2, False),  # another enabled admin remains
        (False, None, True, 1, False),  # not an admin key (or already disabled)
        (False, ["admin"], False, 0, False),  # enabling a disabled admin key adds one
    ],
)
def test_removes_last_admin(
    is_enabled_admin: bool, permissions: list[str] | None, disabled: bool | None, enabled_admins: int, refused: bool
) -> None:
    """§4.2, decision of `admin.keys`: a change that leaves a workspace without an enabled admin key is refused."""
    assert (
        removes_last_admin(
            is_enabled_admin=is_enabled_admin, permissions=permissions, disabled=disabled, enabled_admins=enabled_admins
        )
        is refused
    )
