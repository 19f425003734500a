"""What an attempt writes and reads from start to seal: its inputs, step commits, seals, usage, landed commits
after a blip, and recovery of expired attempts.

This is the face code outside `store/` imports; modules inside `store/` import each other directly.
"""

from __future__ import annotations

from .inputs import AttemptStart, load_attempt_start
from .landed import find_own_checkpoint, read_assigned_entries, read_attempt_end
from .recovery import list_expired_attempts, recover_attempt
from .seals import (
    CommitResult,
    SealRequest,
    advance_thread_after_seal,
    commit_checkpoint,
    failure,
    record_usage,
    seal_run,
)

__all__ = (
    "AttemptStart",
    "CommitResult",
    "SealRequest",
    "advance_thread_after_seal",
    "commit_checkpoint",
    "failure",
    "find_own_checkpoint",
    "list_expired_attempts",
    "load_attempt_start",
    "read_assigned_entries",
    "read_attempt_end",
    "record_usage",
    "recover_attempt",
    "seal_run",
)
