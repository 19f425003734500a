"""§7.13: a spawn the database could not answer is tried again under the same identity before the model is told."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pydantic_ai import ModelRetry

from candor.service.errors import StoreUnavailable
from candor.service.protocol.fencing import Lease
from candor.service.store.threads.children import ChildSpawn, SpawnedChild
from candor.service.worker import children


class _InstantClock:
    def __init__(self) -> None:
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def _service() -> Any:
    return SimpleNamespace(engine=None, settings=None, entropy=None, clock=_InstantClock())


SPAWN = ChildSpawn(agent="helper", text="go", tool_call_id="call_1", allowed_agents=("helper",))
LEASE = Lease(
    run_id="run_1", attempt_id="att_1", thread_id="thr_1", attempt_number=1, worker_id="wrk_1", token=bytes(32)
)


async def test_an_unavailable_database_is_retried_with_the_same_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """§7.13: each retry passes the same (parent run, tool call id) spawn, so a try whose commit landed is found by
    the next one instead of creating a second child; the model never hears of the outage."""
    seen: list[ChildSpawn] = []
    child = SpawnedChild(thread_id="thr_1", run_id="run_1", created=False)

    async def flaky(engine: Any, lease: Any, spawn: ChildSpawn, **_: Any) -> SpawnedChild:
        seen.append(spawn)
        if len(seen) < 3:
            raise StoreUnavailable("database unavailable: ConnectionResetError")
        return child

    monkeypatch.setattr(children, "spawn_child", flaky)
    service = _service()
    assert await children._spawn_with_retries(service, LEASE, SPAWN) is child
    assert seen == [SPAWN, SPAWN, SPAWN]
    assert service.clock.slept == list(children.SPAWN_RETRY_DELAYS)


async def test_a_lasting_outage_is_told_to_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """§7.13: after the last try the model gets `child_start_unavailable` (a tool retry), not a failed run."""
    calls = 0

    async def down(*_: Any, **__: Any) -> SpawnedChild:
        nonlocal calls
        calls += 1
        raise StoreUnavailable("database unavailable: OSError")

    monkeypatch.setattr(children, "spawn_child", down)
    with pytest.raises(ModelRetry, match=r"^child_start_unavailable: "):
        await children._spawn_with_retries(_service(), LEASE, SPAWN)
    assert calls == len(children.SPAWN_RETRY_DELAYS) + 1
