"""`GET /v1/runs`'s query (§8.1, S-98): keyset pages over a workspace's runs, read from an index on both databases.

The list pages newest first on (`created_at`, `id`). The pages must be exact (every run once, ties on `created_at`
broken by `id`), and a page must read its own rows from `ix_runs_workspace_created` (or, for waiting runs,
`ix_runs_workspace_waiting`), not sort all of the workspace's runs: the plan tests ask each database for its plan
and fail on a sort or on a cursor applied as a filter after the scan.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Select
from sqlalchemy.ext.asyncio import AsyncConnection

from candor.service.store.reads.run_lists import list_workspace_runs, select_workspace_runs

from .rows import add_run, add_thread, add_workspace


async def _add_runs(conn: AsyncConnection, workspace_id: str, created: list[float]) -> list[tuple[float, str]]:
    keys = []
    for index, created_at in enumerate(created):
        thread_id = await add_thread(conn, workspace_id)  # one live run per thread (S-1)
        run_id = await add_run(conn, workspace_id, thread_id, id=f"run_{index:02d}", created_at=created_at)
        keys.append((created_at, run_id))
    return keys


async def test_pages_list_every_run_once_newest_first_with_ties_broken_by_id(db: Any) -> None:
    """S-98: walking the cursor yields the workspace's runs exactly once, ordered by (`created_at`, `id`) descending,
    runs created in the same instant included; another workspace's runs never appear."""
    async with db.engine.begin() as conn:
        workspace_id = await add_workspace(conn)
        other = await add_workspace(conn)
        keys = await _add_runs(conn, workspace_id, [100.0, 101.0, 101.0, 101.0, 102.0, 99.0, 101.0])
        other_thread = await add_thread(conn, other)
        await add_run(conn, other, other_thread, id="run_other", created_at=101.0)
    seen: list[tuple[float, str]] = []
    before: tuple[float, str] | None = None
    async with db.engine.connect() as conn:
        while True:
            page = await list_workspace_runs(
                conn, workspace_id=workspace_id, status=None, awaiting_resume=False, limit=3, before=before
            )
            seen += [(row.created_at, row.id) for row in page]
            if len(page) < 3:
                break
            before = seen[-1]
    assert seen == sorted(keys, reverse=True)


async def _plan(conn: AsyncConnection, query: Select[Any]) -> str:
    """The database's plan for `query`, as text. PostgreSQL is told not to seq-scan or sort where it has another
    way, so that the plan of a table this small shows what it would do with a large one."""
    sql = str(query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    if conn.dialect.name == "postgresql":
        await conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        await conn.exec_driver_sql("SET LOCAL enable_sort = off")
        rows = (await conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {sql}")).scalar_one()
        return json.dumps(rows if not isinstance(rows, str) else json.loads(rows))
    return "\n".join(str(row[-1]) for row in await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))


def _assert_index_range(plan: str, dialect: str, index: str) -> None:
    assert index in plan, plan
    if dialect == "postgresql":
        assert '"Sort"' not in plan, plan
        node = next(node for node in _pg_nodes(json.loads(plan)) if node.get("Index Name") == index)
        assert "created_at" in node["Index Cond"], node  # the cursor starts the range; it is not a filter
        assert "created_at" not in node.get("Filter", ""), node
    else:
        assert "TEMP B-TREE" not in plan, plan  # no sort
        assert "(created_at,id)<" in plan.replace(" ", ""), plan  # the cursor is part of the index range


def _pg_nodes(plan: Any) -> list[dict[str, Any]]:
    nodes = []
    stack = [entry["Plan"] for entry in plan]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.get("Plans", []))
    return nodes


async def test_a_page_of_a_workspaces_runs_reads_the_keyset_index(db: Any) -> None:
    """A page past a cursor is a range of `ix_runs_workspace_created`, walked in order: no sort."""
    query = select_workspace_runs(
        workspace_id="wsp_x", status=None, awaiting_resume=False, limit=50, before=(101.0, "run_x")
    )
    async with db.engine.begin() as conn:
        _assert_index_range(await _plan(conn, query), db.kind, "ix_runs_workspace_created")


async def test_the_waiting_runs_page_reads_the_waiting_index(db: Any) -> None:
    """The approvals console's list (waiting runs awaiting a resume) reads `ix_runs_workspace_waiting`."""
    for status, awaiting_resume in (("waiting", False), (None, True)):
        query = select_workspace_runs(
            workspace_id="wsp_x", status=status, awaiting_resume=awaiting_resume, limit=50, before=(101.0, "run_x")
        )
        async with db.engine.begin() as conn:
            _assert_index_range(await _plan(conn, query), db.kind, "ix_runs_workspace_waiting")
