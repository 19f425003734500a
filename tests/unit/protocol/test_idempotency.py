"""Canonical JSON, request digests, key validation and replay or conflict (spec §8.2)."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from candor.service.protocol.idempotency import (
    IDEMPOTENCY_KEY_PATTERN,
    KeyProblem,
    canonical_json,
    replay_or_conflict,
    request_digest,
    resume_digest,
    sha256_hex,
    validate_idempotency_key,
)

BODY = {"input": {"content": [{"type": "text", "text": "héllo"}]}, "agent": "a", "options": {"b": 1, "a": [1, 2]}}


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"b": 1, "a": 2}, '{"a":2,"b":1}'),
        ({"a": {"d": None, "c": [1, 2.5, True]}}, '{"a":{"c":[1,2.5,true],"d":null}}'),
        (["x", "é", "\u2603"], '["x","é","☃"]'),
        ("tab\there", '"tab\\there"'),
        ([], "[]"),
    ],
)
def test_canonical_json(value, text):
    """S-81, S-90: sorted keys, compact separators, non-ASCII kept as UTF-8."""
    assert canonical_json(value) == text


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {"a": [float("-inf")]}])
def test_canonical_json_refuses_nan(bad):
    """S-81: NaN and infinities have no JSON form and are refused."""
    with pytest.raises(ValueError):
        canonical_json(bad)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


@given(_json)
def test_canonical_json_round_trips_and_is_stable(value):
    """S-81, S-90: canonical JSON parses back to the same value and re-encodes to the same text."""
    text = canonical_json(value)
    assert json.loads(text) == value
    assert canonical_json(json.loads(text)) == text


@given(st.dictionaries(st.text(max_size=5), st.integers(), max_size=6))
def test_key_order_does_not_change_the_digest(mapping):
    """S-81, S-90: the same body in another key order has the same digest."""
    reordered = dict(reversed(list(mapping.items())))
    assert request_digest("message", "thr_1", mapping) == request_digest("message", "thr_1", reordered)


def test_request_digest_is_sha256_of_kind_target_body():
    """S-90: SHA-256 hex of the canonical JSON of [kind, target, body]."""
    expected = hashlib.sha256(canonical_json(["thread", "", BODY]).encode()).hexdigest()
    assert request_digest("thread", "", BODY) == expected
    assert sha256_hex(canonical_json(BODY)) == hashlib.sha256(canonical_json(BODY).encode()).hexdigest()


def test_resume_digest_is_sha256_of_run_and_body():
    """S-81: SHA-256 hex of the canonical JSON of [run_id, body]."""
    body = {"approvals": {"c1": {"action": "approve"}}, "calls": {}}
    expected = hashlib.sha256(canonical_json(["run_1", body]).encode()).hexdigest()
    assert resume_digest("run_1", body) == expected


@pytest.mark.parametrize(
    ("first", "second", "verdict"),
    [
        (("message", "thr_1", BODY), ("message", "thr_1", dict(reversed(list(BODY.items())))), "replay"),
        (("message", "thr_1", BODY), ("message", "thr_2", BODY), "conflict"),
        (("message", "thr_1", BODY), ("fork", "thr_1", BODY), "conflict"),
        (("thread", "", BODY), ("thread", "", {**BODY, "agent": "b"}), "conflict"),
        (("fork", "run_1", BODY), ("fork", "run_1", BODY), "replay"),
    ],
)
def test_replay_or_conflict_for_messages(first, second, verdict):
    """S-90: same key and body → replay (200); another body or target → 409 idempotency_key_reused."""
    assert replay_or_conflict(request_digest(*first), request_digest(*second)) == verdict


@pytest.mark.parametrize(
    ("first", "second", "verdict"),
    [
        (("run_1", {"calls": {"c": {"status": "returned", "value": 1}}}),) * 2 + ("replay",),
        (("run_1", {"calls": {}}), ("run_2", {"calls": {}}), "conflict"),
        (("run_1", {"calls": {"c": 1}}), ("run_1", {"calls": {"c": 2}}), "conflict"),
    ],
)
def test_replay_or_conflict_for_resume(first, second, verdict):
    """S-81, S-82: the same resume again replays; another body or another run → idempotency_key_reused."""
    assert replay_or_conflict(resume_digest(*first), resume_digest(*second)) == verdict


@pytest.mark.parametrize(("kind", "target"), [("thread", "thr_1"), ("message", ""), ("fork", "")])
def test_digest_target_shape(kind, target):
    """S-90: thread requests have the empty target; message and fork name theirs."""
    with pytest.raises(ValueError):
        request_digest(kind, target, BODY)


@pytest.mark.parametrize(
    ("key", "result"),
    [
        ("k", "k"),
        ("!~", "!~"),
        ("a" * 512, "a" * 512),
        ("0f2c-AZ_az.:/@[]{}", "0f2c-AZ_az.:/@[]{}"),
        (None, KeyProblem(reason="missing")),
        ("", KeyProblem(reason="missing")),
        ("a" * 513, KeyProblem(reason="too_long")),
        ("has space", KeyProblem(reason="invalid_characters")),
        ("tab\t", KeyProblem(reason="invalid_characters")),
        ("newline\n", KeyProblem(reason="invalid_characters")),
        ("del\x7f", KeyProblem(reason="invalid_characters")),
        ("é", KeyProblem(reason="invalid_characters")),
    ],
)
def test_validate_idempotency_key(key, result):
    """S-93: a missing key, one longer than 512, or one with characters outside !–~ → 400."""
    assert validate_idempotency_key(key) == result


@given(st.text(max_size=600))
def test_key_pattern_is_visible_ascii(key):
    """S-93: valid ⇔ 1–512 characters, each between ! and ~."""
    valid = 1 <= len(key) <= 512 and all("!" <= ch <= "~" for ch in key)
    assert (IDEMPOTENCY_KEY_PATTERN.match(key) is not None) is valid
    assert (validate_idempotency_key(key) == key) is valid
