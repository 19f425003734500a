"""Shared pieces of the provider tests: settings and a Service whose `assistant` agent is bound to a scripted
provider (`[agents.assistant.model]` with `base_url` and `api_key_env = "SCRIPTED_OPENAI_KEY"`)."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from candor.service.agents import AgentRegistry
from candor.service.core import Service
from candor.service.runtime import SeededEntropy
from candor.service.settings import ServiceSettings

from .agents import AGENT, FACTORY

KEY_ENV = "SCRIPTED_OPENAI_KEY"


def provider_settings(
    url: str, base_url: str | None, *, worker: dict[str, Any] | None = None, **model: Any
) -> ServiceSettings:
    """`[agents.assistant]` with `model = {name = "openai:gpt-scripted", base_url, api_key_env}`; short scans."""
    return ServiceSettings(
        database={"url": url, "timeout": 2.0},  # roomy: the test machine is shared and often loaded
        worker={"lease_seconds": 10, "authority_seconds": 0.5, "scan_seconds": 0.05, **(worker or {})},
        agents={
            AGENT: {
                "factory": FACTORY,
                "model": {"name": "openai:gpt-scripted", "base_url": base_url, "api_key_env": KEY_ENV, **model},
            }
        },
    )


def provider_service(db: Any, base_url: str | None, *, worker: dict[str, Any] | None = None, **model: Any) -> Service:
    settings = provider_settings(db.url, base_url, worker=worker, **model)
    return Service(
        settings=settings,
        engine=db.engine,
        agents=AgentRegistry.from_settings(settings.agents),
        entropy=SeededEntropy(secrets.randbits(32)),
        wakeups=asyncio.Event(),
    )
