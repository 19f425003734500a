"""§12.2: a row a request already found but that is gone when the same transaction reads it again is a store
defect; the request fails with the stable `internal` code and changes nothing (no `assert`, which `python -O`
skips). The defect is simulated by making the re-read return None."""

from __future__ import annotations

from typing import Any

import pytest

from candor.service import commands
from candor.service.errors import ServiceError
from candor.service.store import reads as views

from commands.helpers import TEXT, entry_row, make_service, new_key, seal_run, text, thread_row


async def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


async def test_archive_whose_thread_is_gone_when_read_again_is_internal(db: Any, monkeypatch: Any) -> None:
    """S-64's archive reads the archived thread back; a missing row → `internal`, and the archive rolls back."""
    service = make_service(db)
    key = await new_key(service)
    created = await commands.create_thread(service, key, agent="demo", input=TEXT, key="create")
    monkeypatch.setattr(views, "get_thread", _nothing)
    with pytest.raises(ServiceError) as raised:
        await commands.archive_thread(service, key, created.thread.id)
    assert raised.value.code == "internal" and "thread" in raised.value.message
    assert (await thread_row(service, created.thread.id)).archived_at is None


async def test_withdraw_whose_thread_is_gone_when_read_again_is_internal(db: Any, monkeypatch: Any) -> None:
    """S-76's withdrawal answers the thread as it is now; a missing row → `internal`, the entry stays pending."""
    service = make_service(db)
    key = await new_key(service)
    created = await commands.create_thread(service, key, agent="demo", input=TEXT, key="create")
    assert created.run is not None
    await seal_run(service, created.run.id, "waiting")
    posted = await commands.post_input(service, key, created.thread.id, input=text("later"), key="post")
    monkeypatch.setattr(views, "get_thread", _nothing)
    with pytest.raises(ServiceError) as raised:
        await commands.withdraw_entry(service, key, created.thread.id, posted.entry.id)
    assert raised.value.code == "internal"
    assert (await entry_row(service, key.workspace_id, posted.entry.id)).status == "pending"


async def test_steer_whose_active_run_is_gone_is_internal(db: Any, monkeypatch: Any) -> None:
    """S-68's steer check reads the active thread's run; a missing row → `internal`, no entry is created."""
    service = make_service(db)
    key = await new_key(service)
    created = await commands.create_thread(service, key, agent="demo", input=TEXT, key="create")
    before = (await thread_row(service, created.thread.id)).version
    monkeypatch.setattr(views, "load_run", _nothing)
    with pytest.raises(ServiceError) as raised:
        await commands.post_input(service, key, created.thread.id, input=text("now"), delivery="steer", key="steer")
    assert raised.value.code == "internal" and "run" in raised.value.message
    assert (await thread_row(service, created.thread.id)).version == before
