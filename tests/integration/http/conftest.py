"""HTTP test fixtures: `api` is a `role="all"` app on the `db` fixture's database (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from candor.service.core import Service
from candor.service.http import create_app

from commands.helpers import make_service
from http_support import Key, client_for, new_key


@dataclass
class Api:
    service: Service
    app: FastAPI
    client: httpx.AsyncClient

    async def key(
        self, workspace_id: str | None = None, permissions: Collection[str] = ("read", "run", "admin")
    ) -> Key:
        return await new_key(self.service, workspace_id, permissions)


@pytest.fixture
async def api(db: Any) -> AsyncIterator[Api]:
    service = make_service(db)
    app = create_app(service, role="all")
    async with client_for(app) as client:
        yield Api(service=service, app=app, client=client)
