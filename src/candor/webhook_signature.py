"""Webhook signatures (§9.4, S-113), for the service that signs deliveries and for receivers that check them.

`Candor-Signature` is `v1=` and the hex HMAC-SHA256, under the subscription's secret, of
`"{Candor-Timestamp}.{Candor-Delivery-Id}.{raw body}"`. Standard library only: `candor.client` re-exports
`verify_signature` without loading the service or its HTTP stack (`candor.service.outbox.webhooks` sends).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

__all__ = ("DELIVERY_ID_HEADER", "TIMESTAMP_HEADER", "SIGNATURE_HEADER", "sign", "verify_signature")

DELIVERY_ID_HEADER = "Candor-Delivery-Id"
TIMESTAMP_HEADER = "Candor-Timestamp"
SIGNATURE_HEADER = "Candor-Signature"


def sign(secret: str, *, timestamp: int, delivery_id: str, body: bytes) -> str:
    """S-113: `v1=` + hex HMAC-SHA256 of `"{timestamp}.{delivery_id}.{body}"` under `secret`."""
    message = f"{timestamp}.{delivery_id}.".encode() + body
    return "v1=" + hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance_seconds: float = 300,
    now: float | None = None,
) -> bool:
    """For receivers: whether `body` with `headers` was signed with `secret` within `tolerance_seconds` of now.

    Header names are matched case-insensitively. Returns False on a missing or malformed header, a timestamp
    outside the tolerance (a replay), or a signature mismatch (compared in constant time):

        from candor.client import verify_signature
        if not verify_signature(secret, request.headers, await request.body()):
            return Response(status_code=400)
    """
    lowered = {key.lower(): value for key, value in headers.items()}
    delivery_id = lowered.get(DELIVERY_ID_HEADER.lower())
    stamp = lowered.get(TIMESTAMP_HEADER.lower())
    signature = lowered.get(SIGNATURE_HEADER.lower())
    if not delivery_id or not stamp or not signature:
        return False
    try:
        timestamp = int(stamp)
    except ValueError:
        return False
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_seconds:
        return False
    expected = sign(secret, timestamp=timestamp, delivery_id=delivery_id, body=body)
    return hmac.compare_digest(expected, signature)
