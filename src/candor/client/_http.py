"""What both clients do with httpx: the shared client settings and turning a response into a `Reply`."""

from __future__ import annotations

from typing import Any

import httpx

from ._core import Reply

__all__ = ("reply_of", "client_settings")


def reply_of(response: httpx.Response) -> Reply:
    try:
        body = response.json() if response.content else None
    except ValueError:
        body = None
    return Reply(status=response.status_code, headers=response.headers, body=body)


def client_settings(base_url: str, api_key: str, timeout: float) -> dict[str, Any]:
    return {
        "base_url": base_url.rstrip("/"),
        "headers": {"Authorization": f"Bearer {api_key}", "User-Agent": "candor-client/1"},
        # A read timeout above the stream's 15 s keep-alive, so a quiet stream is not taken for a dead one.
        "timeout": httpx.Timeout(timeout, read=max(timeout, 45.0)),
    }
