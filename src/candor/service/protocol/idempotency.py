"""Idempotency keys and request digests: canonical JSON, the §8.2 digests, and replay or conflict."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from .canonical import canonical_json, sha256_hex

__all__ = (
    "canonical_json",
    "sha256_hex",
    "RequestKind",
    "request_digest",
    "resume_digest",
    "IDEMPOTENCY_KEY_MAX_LENGTH",
    "IDEMPOTENCY_KEY_PATTERN",
    "KeyProblem",
    "validate_idempotency_key",
    "replay_or_conflict",
)


RequestKind = Literal["thread", "message", "fork"]


def request_digest(kind: RequestKind, target: str, body: object) -> str:
    """S-90, S-82: digest of ``[kind, target, body]``; target is ``""`` for thread, the thread id for message,
    the origin run id for fork (§8.2)."""
    if kind == "thread" and target != "":
        raise ValueError("a thread request has the empty target")
    if kind != "thread" and not target:
        raise ValueError(f"a {kind} request needs its target id")
    return sha256_hex(canonical_json([kind, target, body]))


def resume_digest(run_id: str, body: object) -> str:
    """S-81, S-82: digest of ``[run_id, body]`` for ``POST /v1/runs/{run_id}/resume`` (§8.2)."""
    if not run_id:
        raise ValueError("a resume digest needs the run id")
    return sha256_hex(canonical_json([run_id, body]))


IDEMPOTENCY_KEY_MAX_LENGTH: Final = 512
IDEMPOTENCY_KEY_PATTERN: Final = re.compile(r"\A[!-~]{1,512}\Z")
"""§8.2: 1–512 visible ASCII characters (``^[!-~]+$``); ``\\Z`` so a trailing newline does not slip through."""


@dataclass(frozen=True, kw_only=True, slots=True)
class KeyProblem:
    """Why an ``Idempotency-Key`` header is refused (→ 400 ``invalid_argument``). Never echoes the key."""

    reason: Literal["missing", "too_long", "invalid_characters"]


def validate_idempotency_key(key: str | None) -> str | KeyProblem:
    """S-93: the key when valid, else the problem; an absent or empty header is ``missing``."""
    if not key:
        return KeyProblem(reason="missing")
    if len(key) > IDEMPOTENCY_KEY_MAX_LENGTH:
        return KeyProblem(reason="too_long")
    if IDEMPOTENCY_KEY_PATTERN.match(key) is None:
        return KeyProblem(reason="invalid_characters")
    return key


def replay_or_conflict(stored_digest: str, digest: str) -> Literal["replay", "conflict"]:
    """S-81, S-82, S-90: a repeated key replays when its digest matches, else 409 ``idempotency_key_reused``."""
    return "replay" if stored_digest == digest else "conflict"
