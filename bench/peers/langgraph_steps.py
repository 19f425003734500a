"""LangGraph side of `bench.durable_steps`; runs in the peers venv (`bench/.venv-peers/bin/python`), not candor's.

The same scripted workload as candor's side: a ReAct-shaped graph (`agent` node → `ToolNode` → `agent` ...) whose
scripted agent node asks for the `step` tool once per step (a 200-byte result), `steps` times, then answers. Runs
are invoked with `durability="sync"` on a `PostgresSaver` (a scratch database created on the server and dropped
afterwards) and a `SqliteSaver` (a file in a temporary directory). Prints one JSON object on its last stdout line:

    {"versions": {...}, "postgres_version": "...", "results": [{"backend", "steps", "run_seconds": [...],
      "stored_bytes": int, "cumulative_bytes": [...]}], "skipped": {backend: reason}}

`cumulative_bytes[k]` is the checkpoint payload stored for the thread once the k-th tool result is in the state
(k = 0: after the input), read by SQL after each `put` during one extra, untimed run.

    bench/.venv-peers/bin/python bench/peers/langgraph_steps.py --steps 5,20,80 --runs 10
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import secrets
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from psycopg.rows import dict_row

TOOL_RESULT = "r" * 200


@tool
def step(n: int) -> str:
    """One unit of work."""
    return TOOL_RESULT


def build_graph(
    steps: int,
    checkpointer: Any,
    model_seconds: float = 0.0,
    on_model_request: Callable[..., None] | None = None,
) -> Any:
    """`model_seconds`: the scripted model's think time per response (`bench.service_steps`' concurrent load);
    `on_model_request(run_key, final=...)`: called as each model request starts, the run named by its prompt
    (bench/_step_clock.py)."""

    def agent(state: MessagesState) -> dict[str, Any]:
        done = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
        if on_model_request is not None:
            on_model_request(str(state["messages"][0].content), final=done >= steps)
        if model_seconds > 0:
            time.sleep(model_seconds)
        if done < steps:
            call = {"name": "step", "args": {"n": done}, "id": f"call_{done:06d}", "type": "tool_call"}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}
        return {"messages": [AIMessage(content=f"finished {done} steps")]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([step]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


# --- stored payload bytes (the same columns a user would back up) ------------------------------------------------

PG_BYTES = (
    "SELECT coalesce((SELECT sum(octet_length(checkpoint::text) + octet_length(metadata::text)) FROM checkpoints"
    "  WHERE thread_id = %(t)s), 0)"
    " + coalesce((SELECT sum(octet_length(blob)) FROM checkpoint_blobs WHERE thread_id = %(t)s), 0)"
    " + coalesce((SELECT sum(octet_length(blob)) FROM checkpoint_writes WHERE thread_id = %(t)s), 0)"
)
SQLITE_BYTES = (
    "SELECT coalesce((SELECT sum(length(checkpoint) + length(metadata)) FROM checkpoints WHERE thread_id = ?), 0)"
    " + coalesce((SELECT sum(length(value)) FROM writes WHERE thread_id = ?), 0)"
)


def measured(cls: type, count_bytes: Callable[[str], int]) -> type:
    """A saver subclass that, when `probe` is set, records (messages in state, stored bytes) after every put."""

    class Measured(cls):  # type: ignore[misc, valid-type]
        probe: list[tuple[int, int]] | None = None

        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            result = super().put(config, checkpoint, metadata, new_versions)
            if self.probe is not None:
                messages = checkpoint.get("channel_values", {}).get("messages", [])
                self.probe.append((len(messages), count_bytes(config["configurable"]["thread_id"])))
            return result

    return Measured


@contextmanager
def postgres_saver(url: str) -> Iterator[tuple[Any, Callable[[str], int]]]:
    name = f"langgraph_bench_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    target = psycopg.conninfo.make_conninfo(url, dbname=name)
    try:
        with (
            psycopg.connect(target, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn,
            psycopg.connect(target, autocommit=True) as probe_conn,
        ):

            def count(thread_id: str) -> int:
                return int(probe_conn.execute(PG_BYTES, {"t": thread_id}).fetchone()[0])

            saver = measured(PostgresSaver, count)(conn)
            saver.setup()
            yield saver, count
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def sqlite_saver() -> Iterator[tuple[Any, Callable[[str], int]]]:
    with tempfile.TemporaryDirectory(prefix="langgraph-bench-") as tmp:
        conn = sqlite3.connect(str(Path(tmp) / "checkpoints.db"), check_same_thread=False)
        try:

            def count(thread_id: str) -> int:
                return int(conn.execute(SQLITE_BYTES, (thread_id, thread_id)).fetchone()[0])

            saver = measured(SqliteSaver, count)(conn)
            saver.setup()
            yield saver, count
        finally:
            conn.close()


def one_run(graph: Any, steps: int) -> tuple[str, float]:
    thread_id = "thr_" + secrets.token_hex(16)
    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": 4 * steps + 10}
    started = time.perf_counter()
    result = graph.invoke({"messages": [HumanMessage("Run the loop.")]}, config, durability="sync")
    elapsed = time.perf_counter() - started
    final = result["messages"][-1]
    if final.content != f"finished {steps} steps" or len(result["messages"]) != 2 * steps + 2:
        raise RuntimeError(f"unexpected final state: {final.content!r}, {len(result['messages'])} messages")
    return thread_id, elapsed


def measure_backend(
    saver: Any, count: Callable[[str], int], backend: str, steps_list: list[int], runs: int, warmup: int
) -> list[dict[str, Any]]:
    results = []
    for steps in steps_list:
        graph = build_graph(steps, saver)
        for _ in range(warmup):
            one_run(graph, steps)
        times = [one_run(graph, steps)[1] for _ in range(runs)]
        saver.probe = []
        thread_id, _ = one_run(graph, steps)
        probe, saver.probe = saver.probe, None
        at_count: dict[int, int] = {}
        for messages, total in probe:
            at_count[messages] = total
        cumulative = [at_count.get(1 + 2 * k, 0) for k in range(steps + 1)]
        results.append(
            {
                "backend": backend,
                "steps": steps,
                "run_seconds": times,
                "stored_bytes": count(thread_id),
                "cumulative_bytes": cumulative,
                "puts": len(probe),
            }
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="LangGraph + PostgresSaver/SqliteSaver side of bench.durable_steps")
    parser.add_argument("--steps", default="5,20,80", help="comma-separated steps per run (default: 5,20,80)")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per steps value and backend (default: 10)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed warm-up runs (default: 1)")
    parser.add_argument("--backends", default="postgresql,sqlite", help="comma-separated (default: postgresql,sqlite)")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args(argv)
    steps_list = [int(s) for s in args.steps.split(",") if s.strip()]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    out: dict[str, Any] = {
        "versions": {
            p: importlib.metadata.version(p)
            for p in (
                "langgraph",
                "langgraph-checkpoint",
                "langgraph-checkpoint-postgres",
                "langgraph-checkpoint-sqlite",
                "langchain-core",
                "psycopg",
            )
        },
        "python": sys.version.split()[0],
        "results": [],
        "skipped": {},
        "postgres_version": None,
    }
    for backend in backends:
        if backend == "postgresql":
            try:
                with psycopg.connect(args.postgres_url, connect_timeout=5) as conn:
                    out["postgres_version"] = conn.execute("SHOW server_version").fetchone()[0]
            except Exception as exc:  # noqa: BLE001 - reported as a skip, never a figure
                out["skipped"][backend] = f"PostgreSQL not reachable: {type(exc).__name__}: {exc}"
                continue
            factory = lambda: postgres_saver(args.postgres_url)  # noqa: E731
        elif backend == "sqlite":
            factory = sqlite_saver
        else:
            parser.error(f"unknown backend {backend!r}")
        with factory() as (saver, count):
            out["results"].extend(measure_backend(saver, count, backend, steps_list, args.runs, args.warmup))
        print(f"{backend} done", file=sys.stderr, flush=True)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
