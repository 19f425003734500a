"""Public face: tool recovery helpers and the unknown-outcome result (spec §3.10)."""

from .harness.recovery_tools import (
    RECOVERY_RETRY_SAFE_METADATA_KEY,
    UNKNOWN_OUTCOME_CONTENT,
    UNKNOWN_OUTCOME_METADATA_KEY,
    is_retry_safe,
    recovery_retryable,
    unknown_outcome_result,
)

__all__ = (
    "recovery_retryable",
    "RECOVERY_RETRY_SAFE_METADATA_KEY",
    "UNKNOWN_OUTCOME_METADATA_KEY",
    "UNKNOWN_OUTCOME_CONTENT",
    "unknown_outcome_result",
    "is_retry_safe",
)
