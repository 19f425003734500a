"""Thread and run identifiers: formats, validation and generation (pure; randomness is injectable)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable

THREAD_ID_PATTERN = re.compile(r"^[a-z][a-z0-9]*_[a-z0-9]+$")
THREAD_ID_MAX_LENGTH = 256
RUN_ID_PATTERN = re.compile(r"^run_[0-9a-f]{32}$")

TokenHex = Callable[[int], str]


def new_thread_id(token_hex: TokenHex = secrets.token_hex) -> str:
    """`thr_` + 32 lowercase hex digits (H-1)."""
    return "thr_" + token_hex(16)


def new_run_id(token_hex: TokenHex = secrets.token_hex) -> str:
    """`run_` + 32 lowercase hex digits (H-10)."""
    return "run_" + token_hex(16)


def is_valid_thread_id(value: str) -> bool:
    """H-2: lowercase prefix, underscore, lowercase alphanumerics; at most 256 characters."""
    return len(value) <= THREAD_ID_MAX_LENGTH and THREAD_ID_PATTERN.fullmatch(value) is not None
