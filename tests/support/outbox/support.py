"""Shared pieces of the outbox tests: a Service with a key ring, subscriptions, and a real local HTTP receiver."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Any

from cryptography.fernet import Fernet
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from candor.service.agents import AgentRegistry
from candor.service.core import Service
from candor.service.runtime import FakeClock, SeededEntropy
from candor.service.settings import ServiceSettings
from candor.service.signing_keys import KeyRing
from candor.service.store.runs.outbox_staging import enqueue_once, new_outbox_id
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import outbox, subscriptions

from worker import support as worker_support

KEY = Fernet.generate_key().decode("ascii")
KEY_RING = KeyRing.from_keys([KEY])
"""The ring of services made with the default `keys`: what tests encrypt stored secrets with."""
SECRET = "whsec_test_secret"
ALL_EVENTS = [
    "run.accepted",
    "run.running",
    "run.waiting",
    "run.completed",
    "run.failed",
    "run.cancelled",
    "run_attempt.leased",
    "run_attempt.running",
    "run_attempt.succeeded",
    "run_attempt.yielded",
    "run_attempt.failed",
    "run_attempt.cancelled",
]


def make_settings(
    url: str,
    *,
    keys: tuple[str, ...] = (KEY,),
    webhook: dict[str, Any] | None = None,
    timeout: float = 2.0,
    insecure: bool = True,
) -> ServiceSettings:
    return ServiceSettings(
        database={"url": url, "timeout": 0.9},
        worker={"lease_seconds": 10, "authority_seconds": 0.5, "scan_seconds": 0.05},
        control={"webhook_timeout": timeout, "webhook_allow_insecure": insecure},
        outbox={"by_kind": {"webhook": webhook or {}}},
        security={"keys": list(keys)},
        agents={"scripted": {"factory": worker_support.FACTORY}},
    )


def make_service(url: str, engine: AsyncEngine, *, clock: FakeClock | None = None, **kwargs: Any) -> Service:
    settings = make_settings(url, **kwargs)
    return Service(
        settings=settings,
        engine=engine,
        agents=AgentRegistry({"scripted": worker_support.FACTORY}),
        clock=clock or FakeClock(),
        entropy=SeededEntropy(secrets.randbits(32)),
        wakeups=asyncio.Event(),
    )


async def add_subscription(
    conn: AsyncConnection,
    tenant: worker_support.Tenant,
    *,
    url: str,
    events: list[str] | None = None,
    filter: dict[str, Any] | None = None,
    secret: str = SECRET,
    encrypted: str | None = None,
) -> str:
    sub_id = worker_support.new_id("sub")
    await conn.execute(
        insert(subscriptions).values(
            id=sub_id,
            workspace_id=tenant.workspace_id,
            name=sub_id,
            url=url,
            events=events or ALL_EVENTS,
            filter=filter or {},
            enabled=True,
            signing_secret=encrypted if encrypted is not None else KEY_RING.encrypt_secret(secret),
            version=1,
            created_by_id=tenant.principal_id,
            updated_by_id=tenant.principal_id,
            created_at=db_now(),
            updated_at=db_now(),
        )
    )
    return sub_id


async def stage_webhooks(engine: AsyncEngine, tenant: worker_support.Tenant, *, url: str, count: int) -> list[str]:
    """Stages `count` pending webhook rows to `url` (as `stage_run_event` would, S-106); returns their ids."""
    ids = [new_outbox_id() for _ in range(count)]
    async with engine.begin() as conn:
        for n, row_id in enumerate(ids):
            payload = {"type": "run.completed", "created_at": 1.0, "data": {"run": {"id": f"run_{n}"}}}
            await enqueue_once(
                conn,
                kind="webhook",
                dedupe_key=f"test-{row_id}",
                target=url,
                payload=payload,
                workspace_id=tenant.workspace_id,
                signing_secret=KEY_RING.encrypt_secret(SECRET),
                row_id=row_id,
            )
    return ids


async def outbox_rows(engine: AsyncEngine, *, kind: str | None = None) -> list[Any]:
    query = select(outbox).order_by(outbox.c.created_at, outbox.c.id)
    if kind is not None:
        query = query.where(outbox.c.kind == kind)
    async with engine.connect() as conn:
        return list((await conn.execute(query)).mappings().all())


async def outbox_row(engine: AsyncEngine, row_id: str) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(select(outbox).where(outbox.c.id == row_id))).mappings().one()


async def make_due(engine: AsyncEngine, row_id: str | None = None) -> None:
    async with engine.begin() as conn:
        query = update(outbox).values(available_at=db_now() - 1)
        if row_id is not None:
            query = query.where(outbox.c.id == row_id)
        await conn.execute(query.where(outbox.c.status == "pending"))


async def db_time(engine: AsyncEngine) -> float:
    async with engine.connect() as conn:
        return float((await conn.execute(select(db_now()))).scalar_one())


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A tiny HTTP/1.1 server on 127.0.0.1. `script` answers requests in order (then `default`): an int status,
    "hang" (never answers), or "redirect" (302 to /elsewhere). With `keep_alive` it answers without
    `Connection: close` and serves further requests on the same connection; `connections` counts accepted ones."""

    script: list[Any] = field(default_factory=list)
    default: Any = 200
    received: list[Received] = field(default_factory=list)
    server: asyncio.AbstractServer | None = None
    port: int = 0
    keep_alive: bool = False
    connections: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> Receiver:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await self._answer_one(reader, writer) and self.keep_alive:
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _answer_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Reads and answers one request; False when the peer closed the connection or the answer was "hang"."""
        request_line = (await reader.readline()).decode()
        if not request_line:
            return False
        headers: dict[str, str] = {}
        while True:
            line = (await reader.readline()).decode()
            if line in ("\r\n", "\n", ""):
                break
            name, _, value = line.partition(":")
            headers[name.strip()] = value.strip()
        length = int(headers.get("Content-Length", headers.get("content-length", "0")))
        body = await reader.readexactly(length) if length else b""
        self.received.append(Received(path=request_line.split(" ")[1], headers=headers, body=body))
        answer = self.script.pop(0) if self.script else self.default
        connection = "keep-alive" if self.keep_alive else "close"
        if answer == "hang":
            await asyncio.sleep(30)
            return False
        if answer == "redirect":
            writer.write(
                f"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\nConnection: {connection}\r\n\r\n".encode()
            )
        else:
            writer.write(f"HTTP/1.1 {answer} X\r\nContent-Length: 2\r\nConnection: {connection}\r\n\r\nok".encode())
        await writer.drain()
        return True
