"""Public face: tool recovery helpers, the unknown-outcome result (spec §3.10) and reconcilers (reconcile.py)."""

from .harness.reconcile import (
    CALL_KEY_METADATA_KEY,
    DEFAULT_RECONCILE_TIMEOUT,
    RECONCILER_METADATA_KEY,
    RECOVERY_METADATA_KEY,
    NotDone,
    OutcomeUnknown,
    Reconciled,
    Reconciler,
    ReconcileRequest,
    call_key,
    derive_call_key,
    reconciler_for,
    with_reconciler,
)
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
    "reconciler_for",
    "with_reconciler",
    "Reconciler",
    "ReconcileRequest",
    "Reconciled",
    "NotDone",
    "OutcomeUnknown",
    "call_key",
    "derive_call_key",
    "RECONCILER_METADATA_KEY",
    "RECOVERY_METADATA_KEY",
    "CALL_KEY_METADATA_KEY",
    "DEFAULT_RECONCILE_TIMEOUT",
)
