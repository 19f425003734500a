"""`GET /v1/threads`'s query (§8.1, S-98): keyset pages over a workspace's threads, read from
`ix_threads_workspace_created` on both databases (migration 0006), whatever the filters."""

from __future__ import annotations

from typing import Any

import pytest

from candor.service.store.reads.thread_lists import ThreadFilters, list_workspace_threads, select_workspace_threads

from .rows import add_thread, add_workspace
from .test_run_lists import _assert_index_range, _plan


async def test_pages_list_every_thread_once_newest_first_with_ties_broken_by_id(db: Any) -> None:
    """S-98: walking the cursor yields the workspace's threads exactly once, ordered by (`created_at`, `id`)
    descending, threads created in the same instant included; another workspace's threads never appear; an id prefix
    holding LIKE's wildcards matches them literally."""
    async with db.engine.begin() as conn:
        workspace_id = await add_workspace(conn)
        other = await add_workspace(conn)
        keys = []
        for index, created_at in enumerate([100.0, 101.0, 101.0, 101.0, 102.0, 99.0, 101.0]):
            thread_id = await add_thread(conn, workspace_id, id=f"thr_{index:02d}", created_at=created_at)
            keys.append((created_at, thread_id))
        await add_thread(conn, workspace_id, id="thr_a%b", created_at=50.0)
        await add_thread(conn, other, id="thr_other", created_at=101.0)
    seen: list[tuple[float, str]] = []
    before: tuple[float, str] | None = None
    async with db.engine.connect() as conn:
        while True:
            page = await list_workspace_threads(
                conn, workspace_id=workspace_id, filters=ThreadFilters(id_prefix="thr_0"), limit=3, before=before
            )
            seen += [(row.created_at, row.id) for row in page]
            if len(page) < 3:
                break
            before = seen[-1]
        assert seen == sorted(keys, reverse=True)
        literal = await list_workspace_threads(
            conn, workspace_id=workspace_id, filters=ThreadFilters(id_prefix="thr_a%"), limit=10
        )
        assert [row.id for row in literal] == ["thr_a%b"]
        wildcard = await list_workspace_threads(
            conn, workspace_id=workspace_id, filters=ThreadFilters(id_prefix="thr__"), limit=10
        )
        assert wildcard == []


@pytest.mark.parametrize(
    "filters",
    [
        ThreadFilters(),
        ThreadFilters(agent="demo"),
        ThreadFilters(state="waiting"),
        ThreadFilters(state="idle"),
        ThreadFilters(id_prefix="thr_1"),
        ThreadFilters(origin_thread_id="thr_x"),
    ],
)
async def test_a_page_of_a_workspaces_threads_reads_the_keyset_index(db: Any, filters: ThreadFilters) -> None:
    """A page past a cursor is a range of `ix_threads_workspace_created`, walked in order (no sort), with or
    without filters."""
    query = select_workspace_threads(workspace_id="wsp_x", filters=filters, limit=50, before=(101.0, "thr_x"))
    async with db.engine.begin() as conn:
        _assert_index_range(await _plan(conn, query), db.kind, "ix_threads_workspace_created")
