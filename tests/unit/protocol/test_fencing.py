"""The fence predicate, lease tokens, renewal and the local deadline (spec §7.3, §7.4)."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from candor.service.protocol.fencing import (
    LEASE_TOKEN_BYTES,
    FenceSnapshot,
    FenceVerdict,
    Lease,
    check_fence,
    hash_lease_token,
    is_expired_for_recovery,
    is_renewable,
    lease_expiry,
    local_deadline,
    local_deadline_reached,
    may_start_fenced_write,
    new_lease_token,
    should_renew,
)
from candor.service.protocol.transitions import ATTEMPT_STATUSES, RUN_STATUSES

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
TOKEN = bytes(range(32))
LEASE = Lease(
    run_id="run_" + "1" * 32,
    attempt_id="att_" + "2" * 32,
    thread_id="thr_" + "3" * 32,
    attempt_number=1,
    worker_id="worker-a",
    token=TOKEN,
)
GOOD = FenceSnapshot(
    run_status="running",
    run_current_attempt_id=LEASE.attempt_id,
    attempt_id=LEASE.attempt_id,
    attempt_status="running",
    attempt_worker_id="worker-a",
    lease_token_hash=hash_lease_token(TOKEN),
    lease_expires_at=NOW + timedelta(seconds=10),
)


def test_token_hash_is_sha256_hex():
    """S-21: only the SHA-256 hex of the token is stored."""
    assert hash_lease_token(TOKEN) == hashlib.sha256(TOKEN).hexdigest()
    assert len(hash_lease_token(TOKEN)) == 64


def test_new_token_draws_32_bytes_from_the_injected_source():
    """S-21: a fresh 32-byte token per claim, from the injected random source."""
    rng = random.Random(7)
    token = new_lease_token(rng.randbytes)
    assert len(token) == LEASE_TOKEN_BYTES
    assert token == random.Random(7).randbytes(32)
    with pytest.raises(ValueError):
        new_lease_token(lambda n: b"short")


def test_lease_repr_hides_the_token():
    """S-21: the raw token exists only in worker memory and never reaches a log line."""
    assert TOKEN.hex() not in repr(LEASE)
    assert repr(TOKEN) not in repr(LEASE)


def test_good_lease_passes():
    """S-20: a lease whose run, attempt, worker, token and expiry all match may write."""
    assert check_fence(GOOD, LEASE, NOW) == FenceVerdict(ok=True, reason=None)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"run_status": "accepted"}, "run_not_running"),
        ({"run_status": "waiting"}, "run_not_running"),
        ({"run_status": "cancelled"}, "run_not_running"),
        ({"run_current_attempt_id": None}, "attempt_not_current"),
        ({"run_current_attempt_id": "att_" + "9" * 32}, "attempt_not_current"),
        ({"attempt_id": "att_" + "9" * 32}, "attempt_not_current"),
        ({"attempt_status": "failed"}, "attempt_not_live"),
        ({"attempt_status": "yielded"}, "attempt_not_live"),
        ({"attempt_worker_id": "worker-b"}, "worker_mismatch"),
        ({"lease_token_hash": hash_lease_token(b"\x00" * 32)}, "token_mismatch"),
        ({"lease_token_hash": ""}, "token_mismatch"),
        ({"lease_expires_at": NOW}, "lease_expired"),
        ({"lease_expires_at": NOW - timedelta(microseconds=1)}, "lease_expired"),
    ],
)
def test_each_fence_condition(change, reason):
    """S-20: any one mismatch (status, currency, liveness, worker, token, expiry) → LeaseLost with that reason."""
    verdict = check_fence(dataclasses.replace(GOOD, **change), LEASE, NOW)
    assert verdict == FenceVerdict(ok=False, reason=reason)


def test_lease_with_other_attempt_id_is_refused():
    """S-20: the lease's own attempt id must be the run's current attempt."""
    other = dataclasses.replace(LEASE, attempt_id="att_" + "8" * 32)
    assert check_fence(GOOD, other, NOW).reason == "attempt_not_current"


def test_token_comparison_is_constant_time(monkeypatch):
    """S-21: the hash comparison goes through hmac.compare_digest."""
    calls = []
    original = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # the module fencing calls
    assert check_fence(GOOD, LEASE, NOW).ok
    assert calls == [(GOOD.lease_token_hash.encode(), hash_lease_token(TOKEN).encode())]


_snapshots = st.builds(
    FenceSnapshot,
    run_status=st.sampled_from(RUN_STATUSES),
    run_current_attempt_id=st.sampled_from([None, LEASE.attempt_id, "att_other"]),
    attempt_id=st.sampled_from([LEASE.attempt_id, "att_other"]),
    attempt_status=st.sampled_from(ATTEMPT_STATUSES),
    attempt_worker_id=st.sampled_from(["worker-a", "worker-b"]),
    lease_token_hash=st.sampled_from([hash_lease_token(TOKEN), hash_lease_token(b"x" * 32)]),
    lease_expires_at=st.integers(-5_000_000, 5_000_000).map(lambda us: NOW + timedelta(microseconds=us)),
)


@given(_snapshots)
def test_fence_is_the_conjunction_of_section_7_3(snapshot):
    """S-20, S-21: ok exactly when every §7.3 condition holds; a refusal always names a reason."""
    expected = (
        snapshot.run_status == "running"
        and snapshot.run_current_attempt_id == snapshot.attempt_id == LEASE.attempt_id
        and snapshot.attempt_status in ("leased", "running")
        and snapshot.attempt_worker_id == LEASE.worker_id
        and snapshot.lease_token_hash == hash_lease_token(TOKEN)
        and snapshot.lease_expires_at > NOW
    )
    verdict = check_fence(snapshot, LEASE, NOW)
    assert verdict.ok is expected
    assert (verdict.reason is None) is expected


@pytest.mark.parametrize(
    ("remaining", "renew"),
    [
        (30.0, False),
        (25.0, False),
        (20.000001, False),
        (20.0, True),  # exactly 2/3 of 30 s remains
        (10.0, True),
        (0.000001, True),
        (0.0, False),  # ran out: never extended (S-9)
        (-1.0, False),
    ],
)
def test_should_renew_at_two_thirds(remaining, renew):
    """S-23: renew only when no more than 2/3 of the lease remains and it has not run out."""
    assert should_renew(NOW, NOW + timedelta(seconds=remaining), 30) is renew


@given(st.integers(3, 300), st.integers(-400_000_000, 400_000_000))
def test_should_renew_property(lease_seconds, remaining_us):
    """S-23: renewal ⇔ 0 < remaining ≤ 2/3 · lease_seconds."""
    remaining = timedelta(microseconds=remaining_us)
    expected = timedelta(0) < remaining and remaining * 3 <= timedelta(seconds=lease_seconds) * 2
    assert should_renew(NOW, NOW + remaining, lease_seconds) is expected


@pytest.mark.parametrize(
    ("change", "renewable"),
    [
        ({}, True),
        ({"run_status": "accepted"}, False),
        ({"run_current_attempt_id": None}, False),
        ({"attempt_status": "succeeded"}, False),
        ({"lease_expires_at": NOW - timedelta(seconds=1)}, False),
        ({"lease_expires_at": NOW + timedelta(seconds=29)}, False),
        ({"attempt_worker_id": "worker-b", "lease_token_hash": ""}, True),  # renewal is not a token fence
    ],
)
def test_is_renewable(change, renewable):
    """S-23: only a live, unexpired, current attempt of a running run, with ≤ 2/3 left, is renewed."""
    assert is_renewable(dataclasses.replace(GOOD, **change), now=NOW, lease_seconds=30) is renewable


def test_lease_expiry_is_now_plus_lease_seconds():
    """S-15, S-23: claims and renewals set now + worker.lease_seconds."""
    assert lease_expiry(NOW, 30) == NOW + timedelta(seconds=30)


@pytest.mark.parametrize(
    ("change", "expired"),
    [
        ({"lease_expires_at": NOW - timedelta(seconds=1)}, True),
        ({"lease_expires_at": NOW}, False),
        ({}, False),  # renewed meanwhile
        ({"lease_expires_at": NOW - timedelta(seconds=1), "run_current_attempt_id": "att_x"}, False),
        ({"lease_expires_at": NOW - timedelta(seconds=1), "attempt_status": "failed"}, False),
        ({"lease_expires_at": NOW - timedelta(seconds=1), "run_status": "accepted"}, False),
    ],
)
def test_is_expired_for_recovery(change, expired):
    """S-27: expire_leases re-checks under lock: running run, current live attempt, lease past due."""
    assert is_expired_for_recovery(dataclasses.replace(GOOD, **change), now=NOW) is expired


@pytest.mark.parametrize(
    ("now", "reached"),
    [
        (100.0, False),  # claim sent at 100, deadline 130
        (119.9, False),
        (120.0, True),  # 130 − 30/3: a third of the lease is left unconfirmed
        (125.0, True),
        (131.0, True),
    ],
)
def test_local_deadline_reached(now, reached):
    """S-24: cancel the attempt once a third of the lease remains without a confirmed renewal."""
    deadline = local_deadline(100.0, 30)
    assert deadline == 130.0
    assert local_deadline_reached(now, deadline, 30) is reached


@pytest.mark.parametrize(
    ("now", "allowed"),
    [
        (100.0, True),
        (124.9, True),
        (125.0, False),  # exactly database.timeout before the deadline
        (126.0, False),
        (130.0, False),
        (140.0, False),
    ],
)
def test_may_start_fenced_write(now, allowed):
    """S-25: no fenced write starts within database.timeout of the local deadline."""
    assert may_start_fenced_write(now, 130.0, 5.0) is allowed


@given(
    st.floats(0, 1e6, allow_nan=False),
    st.integers(3, 300),
    st.floats(0, 1e6, allow_nan=False),
)
def test_local_deadline_properties(sent_at, lease_seconds, now):
    """S-24, S-25: with 3 × database.timeout < lease_seconds, a write is never allowed once the deadline passed,
    and whenever the cancel point is reached no write may start later than the deadline minus the timeout."""
    db_timeout = lease_seconds / 3 - 0.001
    deadline = local_deadline(sent_at, lease_seconds)
    if now >= deadline:
        assert local_deadline_reached(now, deadline, lease_seconds)
        assert not may_start_fenced_write(now, deadline, db_timeout)
    if may_start_fenced_write(now, deadline, db_timeout):
        assert now + db_timeout < deadline
