"""Shared setup for HTTP tests: an app on the test database, an `httpx.AsyncClient` over `ASGITransport`, and keys
whose secrets the tests send as bearer tokens."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI

from candor.service.core import Service
from candor.service.http import Readiness, Role, create_app
from candor.service.protocol.authority import Principal

from commands.helpers import make_service, new_key_with_secret

REQUEST_ID = re.compile(r"\Areq_[0-9a-f]{32}\Z")
TEXT = {"content": [{"type": "text", "text": "hello"}]}
BASE_URL = "http://candor.test"


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}]}


@dataclass(frozen=True, kw_only=True)
class Key:
    """A principal and the bearer secret that authenticates it."""

    principal: Principal
    secret: str

    @property
    def id(self) -> str:
        return self.principal.id

    @property
    def workspace_id(self) -> str:
        return self.principal.workspace_id

    def headers(self, idempotency_key: str | None = None, **extra: str) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.secret}"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return headers | {name.replace("_", "-"): value for name, value in extra.items()}


async def new_key(
    service: Service, workspace_id: str | None = None, permissions: Collection[str] = ("read", "run", "admin")
) -> Key:
    principal, secret = await new_key_with_secret(service, workspace_id, permissions)
    return Key(principal=principal, secret=secret)


def client_for(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL)


def app_for(db: Any, *, role: Role = "all", readiness: Readiness | None = None, **sections: Any) -> FastAPI:
    return create_app(make_service(db, **sections), role=role, readiness=readiness)


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The §8.1 envelope's `error`, after checking its shape and that `request_id` equals the header (S-95, S-96)."""
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"code", "message", "details", "request_id"}, error
    assert error["request_id"] == response.headers["x-request-id"]
    assert REQUEST_ID.match(error["request_id"])
    return error


async def create_thread(
    client: httpx.AsyncClient, key: Key, *, idempotency_key: str = "k", agent: str = "demo", **body: Any
) -> httpx.Response:
    payload = {"agent": agent, "input": TEXT} | body
    return await client.post("/v1/threads", json=payload, headers=key.headers(idempotency_key))
