"""Steer batch selection (spec §7.8 step 6, §8.5)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from candor.service.protocol.inbox import SteerBatch, SteerCandidate, is_steer_compatible, select_steer_batch

AGENT, DIGEST = "helper", "d" * 64


def entry(n, size=10, agent=None, digest=None):
    return SteerCandidate(entry_id=f"ent_{n}", position=n, size=size, agent=agent, options_digest=digest)


def select(entries, count=8, nbytes=1000):
    return select_steer_batch(
        entries, run_agent=AGENT, run_options_digest=DIGEST, delivery_count=count, delivery_bytes=nbytes
    )


@pytest.mark.parametrize(
    ("entries", "count", "nbytes", "ids"),
    [
        ([], 8, 1000, ()),
        ([entry(1), entry(2), entry(3)], 8, 1000, ("ent_1", "ent_2", "ent_3")),
        ([entry(1), entry(2), entry(3)], 2, 1000, ("ent_1", "ent_2")),  # count limit
        ([entry(1, 400), entry(2, 400), entry(3, 400)], 8, 1000, ("ent_1", "ent_2")),  # byte limit
        ([entry(1, 400), entry(2, 600), entry(3, 1)], 8, 1000, ("ent_1", "ent_2")),  # exactly at the limit
        ([entry(1, 400), entry(2, 700), entry(3, 1)], 8, 1000, ("ent_1",)),  # stop: no overtaking
        ([entry(1, 1001), entry(2, 1)], 8, 1000, ()),  # an oversize head blocks; it waits for its own run
        ([entry(3), entry(1), entry(2)], 8, 1000, ("ent_1", "ent_2", "ent_3")),  # position order
    ],
)
def test_fifo_batch_within_limits(entries, count, nbytes, ids):
    """S-67: at most delivery_count entries and delivery_bytes bytes per commit, in position order."""
    batch = select(entries, count, nbytes)
    assert batch.entry_ids == ids
    assert batch.size == sum(e.size for e in entries if e.entry_id in ids)


@pytest.mark.parametrize(
    ("entries", "ids"),
    [
        (
            [entry(1, agent=AGENT), entry(2, digest=DIGEST), entry(3, agent=AGENT, digest=DIGEST)],
            ("ent_1", "ent_2", "ent_3"),
        ),
        ([entry(1, agent="other"), entry(2)], ("ent_2",)),
        ([entry(1, digest="e" * 64), entry(2)], ("ent_2",)),
        ([entry(1), entry(2, agent="other"), entry(3)], ("ent_1", "ent_3")),
    ],
)
def test_only_compatible_entries(entries, ids):
    """S-66, S-68: a steer is handed over only when its agent and options digest match (or are omitted)."""
    assert select(entries).entry_ids == ids


@pytest.mark.parametrize(
    ("agent", "digest", "ok"),
    [
        (None, None, True),
        (AGENT, None, True),
        (None, DIGEST, True),
        (AGENT, DIGEST, True),
        ("other", None, False),
        (None, "e" * 64, False),
        ("other", DIGEST, False),
    ],
)
def test_is_steer_compatible(agent, digest, ok):
    """S-68: a steer naming another agent or other options is incompatible (409 run_configuration_immutable)."""
    assert (
        is_steer_compatible(entry_agent=agent, entry_options_digest=digest, run_agent=AGENT, run_options_digest=DIGEST)
        is ok
    )


def test_limits_must_be_positive():
    """S-67: delivery limits are at least 1."""
    with pytest.raises(ValueError):
        select([entry(1)], count=0)


_entries = st.lists(
    st.builds(
        lambda n, size, agent, digest: entry(n, size, agent, digest),
        st.integers(1, 10_000),
        st.integers(1, 400),
        st.sampled_from([None, AGENT, "other"]),
        st.sampled_from([None, DIGEST, "e" * 64]),
    ),
    max_size=30,
    unique_by=lambda e: e.position,
)


@given(_entries, st.integers(1, 10), st.integers(1, 2000))
def test_batch_properties(entries, count, nbytes):
    """S-66, S-67: the batch respects both limits, holds only compatible entries, keeps position order, and is the
    longest compatible prefix that fits."""
    batch = select(entries, count, nbytes)
    by_id = {e.entry_id: e for e in entries}
    chosen = [by_id[i] for i in batch.entry_ids]
    assert len(chosen) <= count
    assert batch.size == sum(e.size for e in chosen) <= nbytes
    assert [e.position for e in chosen] == sorted(e.position for e in chosen)
    compatible = [
        e
        for e in sorted(entries, key=lambda e: e.position)
        if (e.agent in (None, AGENT)) and (e.options_digest in (None, DIGEST))
    ]
    assert chosen == compatible[: len(chosen)]
    if len(chosen) < len(compatible):
        nxt = compatible[len(chosen)]
        assert len(chosen) == count or batch.size + nxt.size > nbytes


def test_batch_value():
    """S-67: the batch reports its ids and total bytes."""
    assert select([entry(1, 5), entry(2, 7)]) == SteerBatch(entry_ids=("ent_1", "ent_2"), size=12)
