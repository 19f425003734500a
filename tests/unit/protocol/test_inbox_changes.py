"""Inbox change decisions (§8.5): who may change an entry in which status, reorder lists, renumbering, limits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from candor.service.protocol.inbox import (
    EntryChangeRefusal,
    entry_change_refusal,
    inbox_would_overflow,
    order_mismatch,
    reordered_positions,
)

ME, OTHER = "prn_me", "prn_other"


@pytest.mark.parametrize(
    ("status", "submitter", "refusal"),
    [
        ("pending", ME, None),
        ("assigned", ME, EntryChangeRefusal(kind="not_pending", reason="entry_assigned")),
        ("consumed", ME, EntryChangeRefusal(kind="not_pending", reason="entry_consumed")),
        ("failed", ME, EntryChangeRefusal(kind="not_pending", reason="entry_failed")),
        ("withdrawn", ME, EntryChangeRefusal(kind="not_pending", reason="entry_withdrawn")),
        ("pending", OTHER, EntryChangeRefusal(kind="not_submitter", reason="not_submitter")),
        ("consumed", OTHER, EntryChangeRefusal(kind="not_submitter", reason="not_submitter")),  # submitter first
        ("pending", None, EntryChangeRefusal(kind="not_submitter", reason="not_submitter")),  # a child result
    ],
)
def test_only_the_submitter_changes_only_pending_entries(status, submitter, refusal):
    """S-74, S-76: a non-pending entry → `entry_<status>`; anyone but the submitter is refused first."""
    assert entry_change_refusal(status=status, submitter_id=submitter, caller_id=ME) == refusal


@pytest.mark.parametrize(
    ("pending", "listed", "missing", "unexpected", "duplicated"),
    [
        (["a", "b", "c"], ["c", "a", "b"], None, None, None),
        ([], [], None, None, None),
        (["a", "b", "c"], ["c", "a"], ("b",), (), ()),
        (["a", "b"], ["b", "a", "x"], (), ("x",), ()),
        (["a", "b"], ["b", "a", "a"], (), (), ("a",)),
        (["a", "b", "c"], ["x", "c", "x"], ("a", "b"), ("x",), ("x",)),
        ([], ["a"], (), ("a",), ()),
    ],
)
def test_reorder_must_list_exactly_the_pending_entries(pending, listed, missing, unexpected, duplicated):
    """S-74: a reorder that leaves out, adds or repeats an entry is refused, naming each."""
    mismatch = order_mismatch(pending, listed)
    if missing is None:
        assert mismatch is None
        return
    assert mismatch is not None
    assert (mismatch.missing, mismatch.unexpected, mismatch.duplicated) == (missing, unexpected, duplicated)
    details = mismatch.details()
    assert details["reason"] == "inbox_order_mismatch" and details["field"] == "entry_ids"
    assert details["missing"] == list(missing)


def test_reorder_hands_out_the_pending_positions_in_the_new_order():
    """S-74: the pending entries keep their set of positions (other entries keep theirs); only moves are listed."""
    pending = [("a", 2), ("b", 5), ("c", 7)]
    assert reordered_positions(pending, ["c", "a", "b"]) == (("c", 2), ("a", 5), ("b", 7))
    assert reordered_positions(pending, ["a", "c", "b"]) == (("c", 5), ("b", 7))
    assert reordered_positions(pending, ["a", "b", "c"]) == ()
    with pytest.raises(ValueError):
        reordered_positions(pending, ["a", "b"])


@given(st.lists(st.integers(min_value=1, max_value=10_000), min_size=0, max_size=30, unique=True), st.randoms())
def test_reorder_keeps_positions_positive_unique_and_in_order(positions, random):
    """S-74: after any reorder the pending entries sit in the requested order on the same positions."""
    pending = [(f"ent_{p}", p) for p in positions]
    order = [entry_id for entry_id, _ in pending]
    random.shuffle(order)
    final = dict(pending) | dict(reordered_positions(pending, order))
    assert sorted(final.values()) == sorted(positions)
    assert [entry_id for entry_id, _ in sorted(final.items(), key=lambda item: item[1])] == order


@pytest.mark.parametrize(
    ("count", "size", "added_count", "added_bytes", "overflows"),
    [
        (1, 10, 1, 10, False),
        (2, 10, 1, 10, True),  # count limit 2
        (1, 90, 1, 10, False),  # exactly at the byte limit 100
        (1, 90, 1, 11, True),
        (1, 90, 0, 10, False),  # an edit growing to the limit
        (1, 90, 0, 11, True),  # an edit growing past it
        (5, 500, 0, -10, False),  # shrinking after the limits were lowered
        (5, 500, 0, 0, False),
    ],
)
def test_inbox_limits(count, size, added_count, added_bytes, overflows):
    """S-73: a change that would exceed `inbox_count` or `inbox_bytes` overflows; one that adds nothing never does."""
    result = inbox_would_overflow(
        count=count, size=size, added_count=added_count, added_bytes=added_bytes, count_limit=2, bytes_limit=100
    )
    assert result is overflows
