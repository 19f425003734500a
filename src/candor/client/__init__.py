"""candor.client: a Python client of the candor HTTP API (docs/client.md), sync and async, built on httpx.

    from candor.client import CandorClient, ResumeBatch

    with CandorClient("http://127.0.0.1:8080", api_key=secret) as client:
        accepted = client.create_thread("support", "Please refund order A1.")
        run = client.wait_for_run(accepted.run.id)
        if run.status == "waiting":
            batch = ResumeBatch(run.pending).approve("call_refund_a1")
            successor = client.resume(run.id, batch)

Both clients share one request-building core (`_core.Operations`): idempotency keys generated per logical call and
reused on its retries, bounded retries on connection errors, 5xx and 429, typed errors from the error envelope.
`verify_signature` checks a webhook delivery (the service's own verifier, re-exported from `candor.webhook_signature`).
"""

from __future__ import annotations

from ..webhook_signature import verify_signature
from ._core import RetryPolicy, new_idempotency_key, text_input
from .aio import AsyncCandorClient
from .batch import ResumeBatch
from .errors import (
    ApiError,
    CandorError,
    Conflict,
    Disabled,
    Forbidden,
    IncompleteBatch,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    RateLimited,
    ServerError,
    TransportFailed,
    Unauthenticated,
    Unavailable,
    WaitTimeout,
)
from .models import Accepted, Page, PendingItem, RecoveredCall, Run
from .sse import LiveOutput, SseParser, StreamEvent
from .sync import CandorClient

__all__ = (
    "CandorClient",
    "AsyncCandorClient",
    "RetryPolicy",
    "ResumeBatch",
    "Accepted",
    "Run",
    "PendingItem",
    "RecoveredCall",
    "Page",
    "StreamEvent",
    "SseParser",
    "LiveOutput",
    "verify_signature",
    "new_idempotency_key",
    "text_input",
    "CandorError",
    "ApiError",
    "InvalidArgument",
    "Unauthenticated",
    "Forbidden",
    "NotFound",
    "Conflict",
    "PreconditionFailed",
    "PayloadTooLarge",
    "Disabled",
    "RateLimited",
    "ServerError",
    "Unavailable",
    "TransportFailed",
    "IncompleteBatch",
    "WaitTimeout",
)
