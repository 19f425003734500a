"""List cursors (pure): S-98 — a cursor is bound to its collection, scope and filters."""

from __future__ import annotations

from typing import Any

import pytest

from candor.service.http.cursors import issue_cursor, keyset, read_cursor
from candor.service.http.errors import InvalidCursor

SCOPE = {"workspace_id": "wsp_1", "thread_id": "thr_1"}
POSITION = [1700000000.123456, "run_" + "a" * 32]


def test_round_trip_keeps_the_position_exactly() -> None:
    cursor = issue_cursor("thread_runs", scope=SCOPE, filters={"status": "waiting"}, position=POSITION)
    assert read_cursor(cursor, "thread_runs", scope=dict(SCOPE), filters={"status": "waiting"}) == POSITION
    assert keyset(POSITION) == (POSITION[0], POSITION[1])
    assert "thr_1" not in cursor and "wsp_1" not in cursor and "=" not in cursor


@pytest.mark.parametrize(
    ("collection", "scope", "filters"),
    [
        ("thread_inbox", SCOPE, {}),
        ("thread_runs", SCOPE | {"thread_id": "thr_2"}, {}),
        ("thread_runs", SCOPE | {"workspace_id": "wsp_2"}, {}),
        ("thread_runs", SCOPE, {"status": "waiting"}),
    ],
)
def test_cursor_for_another_list_is_invalid(collection: str, scope: dict[str, str], filters: dict[str, Any]) -> None:
    """S-98: another collection, scope or filters → `invalid_cursor`."""
    cursor = issue_cursor("thread_runs", scope=SCOPE, filters={}, position=POSITION)
    with pytest.raises(InvalidCursor) as caught:
        read_cursor(cursor, collection, scope=scope, filters=filters)
    assert caught.value.code == "invalid_cursor"


@pytest.mark.parametrize("cursor", ["", "!!", "bm90IGpzb24", "W10", "eyJ2IjoxfQ", "e30"])
def test_malformed_cursors_are_invalid(cursor: str) -> None:
    with pytest.raises(InvalidCursor):
        read_cursor(cursor, "thread_runs", scope=SCOPE, filters={})


@pytest.mark.parametrize("position", [[], ["x", "y"], [1.0], [True, "run_x"], [1.0, 2], [1.0, "a", "b"]])
def test_bad_positions_are_invalid(position: list[Any]) -> None:
    with pytest.raises(InvalidCursor):
        keyset(position)
