"""Fixtures of the provider tests: a Service whose `assistant` agent is bound to a `ScriptedOpenAI` server."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest

from candor.service.agents import AgentRegistry
from candor.service.core import Service
from candor.service.runtime import SeededEntropy
from candor.service.settings import ServiceSettings

from worker import support

from .agents import AGENT, FACTORY

KEY_ENV = "SCRIPTED_OPENAI_KEY"


def provider_settings(url: str, base_url: str, *, worker: dict[str, Any] | None = None, **model: Any) -> ServiceSettings:
    """`[agents.assistant]` with `model = {name = "openai:gpt-scripted", base_url, api_key_env}`; short scans."""
    return ServiceSettings(
        database={"url": url, "timeout": 0.9},
        worker={"lease_seconds": 10, "authority_seconds": 0.5, "scan_seconds": 0.05, **(worker or {})},
        agents={
            AGENT: {
                "factory": FACTORY,
                "model": {"name": "openai:gpt-scripted", "base_url": base_url, "api_key_env": KEY_ENV, **model},
            }
        },
    )


def provider_service(db: Any, base_url: str, **model: Any) -> Service:
    settings = provider_settings(db.url, base_url, **model)
    return Service(
        settings=settings,
        engine=db.engine,
        agents=AgentRegistry.from_settings(settings.agents),
        entropy=SeededEntropy(secrets.randbits(32)),
        wakeups=asyncio.Event(),
    )


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh secret in `SCRIPTED_OPENAI_KEY`, the variable the agent's model settings name."""
    key = f"sk-scripted-{secrets.token_hex(16)}"
    monkeypatch.setenv(KEY_ENV, key)
    return key


@pytest.fixture
async def tenant(db: Any) -> support.Tenant:
    async with db.engine.begin() as conn:
        return await support.add_tenant(conn)
