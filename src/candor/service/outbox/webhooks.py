"""Webhook signing and the POST (§9.4, S-108, S-113).

The body is the canonical JSON `{"id", "type", "created_at", "data"}` whose `id` is the outbox row id, sent as
`Candor-Delivery-Id`. `Candor-Signature` is `v1=` and the hex HMAC-SHA256, under the subscription's secret, of
`"{Candor-Timestamp}.{Candor-Delivery-Id}.{raw body}"` (`sign`). Only a 2xx answer within
`control.webhook_timeout` counts, decided by the status line alone (`post_webhook`). Receivers check a delivery
with `verify_signature(secret, headers, body)`; deliveries are at-least-once: deduplicate on `Candor-Delivery-Id`.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp

from ...webhook_signature import DELIVERY_ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, sign, verify_signature
from ..protocol.canonical import canonical_json

__all__ = (
    "DELIVERY_ID_HEADER",
    "TIMESTAMP_HEADER",
    "SIGNATURE_HEADER",
    "WebhookResult",
    "canonical_body",
    "sign",
    "signed_headers",
    "verify_signature",
    "target_allowed",
    "DRAIN_LIMIT_BYTES",
    "drainable_body",
    "WebhookClient",
    "webhook_client",
    "post_webhook",
)

DRAIN_LIMIT_BYTES = 16 * 1024
"""The largest announced response body discarded to keep its connection; larger or unannounced ones close it."""

_BODYLESS_STATUSES = frozenset({204, 304})


@dataclass(frozen=True, slots=True)
class WebhookResult:
    """How one POST went: `delivered` (2xx), `failed` (anything else), or `refused` (URL against policy)."""

    result: Literal["delivered", "failed", "refused"]
    error: str | None = None


def canonical_body(*, delivery_id: str, payload: Mapping[str, Any]) -> bytes:
    """The exact bytes POSTed: canonical JSON of `{"id", "type", "created_at", "data"}` (S-113: id = delivery id)."""
    document = {
        "id": delivery_id,
        "type": payload["type"],
        "created_at": payload["created_at"],
        "data": payload.get("data", {}),
    }
    return canonical_json(document).encode("utf-8")


def signed_headers(secret: str, *, timestamp: int, delivery_id: str, body: bytes) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        DELIVERY_ID_HEADER: delivery_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp=timestamp, delivery_id=delivery_id, body=body),
    }


def target_allowed(url: str | None, *, allow_insecure: bool) -> bool:
    """§9.4 outbound policy: `https://` with a host, or `http://` too when `control.webhook_allow_insecure`."""
    if not url:
        return False
    parts = urlsplit(url)
    schemes = ("https", "http") if allow_insecure else ("https",)
    return parts.scheme in schemes and bool(parts.hostname)


def drainable_body(status: int, headers: Mapping[str, str]) -> bool:
    """Whether a response's body may be drained (and discarded) to keep the connection: it has none by its
    status, or announces a `Content-Length` of at most `DRAIN_LIMIT_BYTES`. Chunked or unannounced bodies could
    be arbitrarily long or slow, so their connection is closed instead."""
    if status in _BODYLESS_STATUSES or 100 <= status < 200:
        return True
    length = headers.get("content-length")
    if length is None or not length.isdigit() or "transfer-encoding" in headers:
        return False
    return int(length) <= DRAIN_LIMIT_BYTES


class WebhookClient:
    """The pooled HTTP/1.1 client of one delivery loop (aiohttp): at most `connections` open (a kind's
    `parallel`), all kept alive between deliveries, redirects never followed (S-108), response bodies never
    decoded. aiohttp rather than httpx because delivery is CPU-bound on the client, and httpx's pool checks every
    pooled connection's socket on each request.

    Proxies come from the environment as before (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`), read once
    when the client is made, and the choice is remembered per origin; aiohttp's own `trust_env` would re-read the
    environment and `~/.netrc` on every request. The session is created on first use, inside the running loop."""

    def __init__(self, *, connections: int) -> None:
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._proxies = urllib.request.getproxies_environment()
        self._proxy_by_origin: dict[tuple[str, str], str | None] = {}

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.connections, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, trust_env=False, timeout=aiohttp.ClientTimeout(total=None)
            )
        return self._session

    def proxy_for(self, url: str) -> str | None:
        """The proxy the environment names for `url`'s scheme, unless `NO_PROXY` exempts its host."""
        if not self._proxies:
            return None
        parts = urlsplit(url)
        origin = (parts.scheme, parts.netloc)
        if origin not in self._proxy_by_origin:
            proxy = self._proxies.get(parts.scheme) or self._proxies.get("all")
            bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]  # not in typeshed
            if proxy and bypass(parts.netloc, self._proxies):
                proxy = None
            self._proxy_by_origin[origin] = proxy or None
        return self._proxy_by_origin[origin]

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def webhook_client(*, connections: int) -> WebhookClient:
    """The pooled client of one delivery loop: at most `connections` open (a kind's `parallel`)."""
    return WebhookClient(connections=connections)


async def _discard_body(response: aiohttp.ClientResponse) -> None:
    while await response.content.readany():  # bytes dropped unseen: only returns the connection to the pool
        pass


async def post_webhook(
    client: WebhookClient,
    *,
    url: str,
    secret: str,
    delivery_id: str,
    payload: Mapping[str, Any],
    timestamp: int,
    timeout: float,
    allow_insecure: bool,
) -> WebhookResult:
    """One signed POST (S-108): 2xx → delivered; 3xx (not followed), other statuses and errors → failed.

    The response body's bytes are never parsed, stored or logged. To keep the connection for the next delivery, a
    body that `drainable_body` allows is drained and discarded within the same timeout; any other body is not
    touched and the connection is closed instead. A drain that fails or times out after the status arrived changes
    nothing: the status stands."""
    if not target_allowed(url, allow_insecure=allow_insecure):
        return WebhookResult("refused", "target_refused")
    body = canonical_body(delivery_id=delivery_id, payload=payload)
    headers = signed_headers(secret, timestamp=timestamp, delivery_id=delivery_id, body=body)
    status: int | None = None
    try:
        async with asyncio.timeout(timeout):  # the whole exchange, not each phase
            response = await client.session().post(
                url, data=body, headers=headers, allow_redirects=False, proxy=client.proxy_for(url)
            )
            try:
                status = response.status  # decides the outcome; the body is never read (§9.4)
                if drainable_body(status, response.headers):
                    await _discard_body(response)
                else:
                    response.close()  # an unannounced or large body: drop the connection rather than read it
            finally:
                response.release()  # back to the pool when drained; closed otherwise
    except TimeoutError:
        if status is None:
            return WebhookResult("failed", "timeout")
    except (aiohttp.ClientError, OSError) as exc:
        if status is None:
            return WebhookResult("failed", f"transport: {type(exc).__name__}")
    if status is not None and 200 <= status < 300:
        return WebhookResult("delivered")
    return WebhookResult("failed", f"http_status: {status}")
