"""One in-process system of `bench.service_steps` and `bench.production_steps`, driven over stdin/stdout so its
process CPU can be read alone.

Systems: `pydantic-ai` (bare `Agent.run`, no persistence), `harness` (candor `Harness.run`, no persistence; needs
candor's venv), `floor` (the Harness with a bare INSERT of the new messages at every boundary on PostgreSQL,
bench/_floor_commit.py; candor's venv), `langgraph` (a ReAct graph with `PostgresSaver` or `SqliteSaver`,
`durability="sync"` or `"async"`) and `dbos` (Pydantic AI's `DBOSAgent`: the run a DBOS workflow, each model request
a DBOS step, system database on PostgreSQL or SQLite; DBOS runs function tools inline, so a tool's result is not
checkpointed). Every system runs the same scripted loop: the model
asks for one `step` tool call per response (a 200-byte result), `steps` times, then answers; the model sleeps
`model_seconds` first.

Protocol: the script prints `{"ready": true, "versions": {...}}` once set up, then reads one JSON command per
line, `{"steps": N, "runs": K, "concurrency": C, "model_seconds": S}` (K runs, C at a time), runs it and prints
`{"seconds": wall, "completed": K, "intervals": [...]}` (`intervals`: the seconds between consecutive model
requests of each run, its step latencies, bench/_step_clock.py); `{"quit": true}` ends it. Each run has a prompt of
its own, by which the step clock tells runs apart.

Limits are options, so a benchmark can lift them to the load it offers: `--threads` (the default executor, where
each LangGraph run holds a thread for its whole duration), `--connections` (the floor's and LangGraph's pools, DBOS's
system database pool) and `--durability` (LangGraph's `sync` or `async` checkpoint writes).

    bench/.venv-peers/bin/python bench/peers/step_server.py --system dbos --database-url postgresql://…/db
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import inspect
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `bench`
from bench._step_clock import StepClock

TOOL_RESULT = "r" * 200
PROMPT = "Run the loop."
Runner = Callable[[int, float, str], Awaitable[None]]
"""One run: (steps, model seconds, its prompt)."""
Shape = tuple[int, float]
"""A workload's steps per run and model seconds per request."""


def _versions(*names: str) -> dict[str, str]:
    found = {}
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def _run_key(messages: list[Any]) -> str:
    """The run's prompt (unique per run), from the first user prompt of its history."""
    from pydantic_ai.messages import UserPromptPart

    for part in messages[0].parts:
        if isinstance(part, UserPromptPart):
            return str(part.content)
    raise ValueError("no user prompt in the first message")


def _pydantic_agent(steps: int, model_seconds: float, clock: StepClock, *, name: str = "bench") -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    async def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(1 for m in messages if isinstance(m, ModelResponse))
        clock.model_requested(_run_key(messages), final=done >= steps)
        if model_seconds > 0:
            await asyncio.sleep(model_seconds)
        if done < steps:
            return ModelResponse(parts=[ToolCallPart("step", {"n": done}, tool_call_id=f"call_{done:06d}")])
        return ModelResponse(parts=[TextPart(f"finished {steps} steps")])

    agent = Agent(FunctionModel(script, model_name="bench-loop"), name=name)

    @agent.tool_plain
    async def step(n: int) -> str:
        """One unit of work."""
        return TOOL_RESULT

    return agent


def _usage_limits(steps: int) -> Any:
    from pydantic_ai.usage import UsageLimits

    return UsageLimits(request_limit=steps + 10)


async def pydantic_ai_runner(limits: Limits, shapes: list[Shape]) -> tuple[Runner, Callable[[], None]]:
    agents: dict[tuple[int, float], Any] = {}

    async def run(steps: int, model_seconds: float, prompt: str) -> None:
        key = (steps, model_seconds)
        if key not in agents:
            agents[key] = _pydantic_agent(steps, model_seconds, limits.clock)
        await agents[key].run(prompt, usage_limits=_usage_limits(steps))

    return run, lambda: None


async def harness_runner(limits: Limits, shapes: list[Shape]) -> tuple[Runner, Callable[[], None]]:
    from candor import Harness

    harnesses: dict[tuple[int, float], Any] = {}

    async def run(steps: int, model_seconds: float, prompt: str) -> None:
        key = (steps, model_seconds)
        if key not in harnesses:
            agent = _pydantic_agent(steps, model_seconds, limits.clock)
            harnesses[key] = Harness(agent, usage_limits=_usage_limits(steps))
        await harnesses[key].run(prompt)

    return run, lambda: None


async def floor_runner(limits: Limits, shapes: list[Shape]) -> tuple[Runner, Callable[[], Any]]:
    """The floor of a durable step (bench/_floor_commit.py): the Harness with a bare INSERT at every boundary."""
    from bench._floor_commit import FloorSide

    assert limits.database_url is not None, "floor needs --database-url"
    sides: dict[tuple[int, float], Any] = {}

    async def run(steps: int, model_seconds: float, prompt: str) -> None:
        key = (steps, model_seconds)
        if key not in sides:
            agent = _pydantic_agent(steps, model_seconds, limits.clock)
            side = FloorSide(limits.database_url, agent, _usage_limits(steps), PROMPT, connections=limits.connections)
            sides[key] = side
        await sides[key].run(collect=False, prompt=prompt)

    async def close() -> None:
        for side in sides.values():
            await side.close()

    return run, close


async def dbos_runner(limits: Limits, shapes: list[Shape]) -> tuple[Runner, Callable[[], None]]:
    from dbos import DBOS
    from pydantic_ai.durable_exec.dbos import DBOSAgent

    assert limits.database_url is not None, "dbos needs --database-url"
    config: Any = {
        "name": "candor-bench",
        "system_database_url": limits.database_url,
        "run_admin_server": False,
        "sys_db_pool_size": limits.connections,
    }
    DBOS(config=config)
    # DBOS registers workflows at import/wrap time, before launch: one agent per workload shape, made up front.
    agents = {
        shape: DBOSAgent(_pydantic_agent(*shape, limits.clock, name=f"bench_{shape[0]}_{int(shape[1] * 1000)}"))
        for shape in shapes
    }
    DBOS.launch()

    async def run(steps: int, model_seconds: float, prompt: str) -> None:
        agent = agents.get((steps, model_seconds))
        if agent is None:
            raise ValueError(f"no DBOS agent for {steps} steps with a {model_seconds} s model: pass it in --shapes")
        await agent.run(prompt, usage_limits=_usage_limits(steps))

    return run, DBOS.destroy


async def langgraph_runner(limits: Limits, shapes: list[Shape]) -> tuple[Runner, Callable[[], None]]:
    import langgraph_steps  # the graph of bench.durable_steps' LangGraph side, same directory

    database_url = limits.database_url
    assert database_url is not None, "langgraph needs --database-url"
    if database_url.startswith("postgresql"):
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool

        pool = ConnectionPool(
            database_url,
            min_size=1,
            max_size=limits.connections,
            open=True,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        )
        saver: Any = PostgresSaver(pool)  # type: ignore[arg-type]
        close: Callable[[], None] = pool.close
    else:
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(database_url.removeprefix("sqlite:///"), check_same_thread=False)
        saver = SqliteSaver(conn)  # one connection behind the saver's own lock
        close = conn.close
    saver.setup()
    graphs: dict[tuple[int, float], Any] = {}

    async def run(steps: int, model_seconds: float, prompt: str) -> None:
        key = (steps, model_seconds)
        if key not in graphs:
            graphs[key] = langgraph_steps.build_graph(steps, saver, model_seconds, limits.clock.model_requested)
        config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 4 * steps + 10}
        inputs: Any = {"messages": [("user", prompt)]}
        # The synchronous graph in a thread (the model's sleep blocks only it), as a sync LangGraph app runs.
        await asyncio.to_thread(graphs[key].invoke, inputs, config, durability=limits.durability)

    return run, close


class Limits:
    """What a runner is given: its database, its connection budget, LangGraph's durability, the step clock. (A
    plain class: tests load this script by path, outside `sys.modules`, where a dataclass cannot be made.)"""

    __slots__ = ("clock", "connections", "database_url", "durability")

    def __init__(self, database_url: str | None, connections: int, durability: str, clock: StepClock) -> None:
        self.database_url, self.connections, self.durability, self.clock = database_url, connections, durability, clock


RUNNERS: dict[str, Callable[[Limits, list[Shape]], Awaitable[tuple[Runner, Callable[[], Any]]]]] = {
    "pydantic-ai": pydantic_ai_runner,
    "harness": harness_runner,
    "floor": floor_runner,
    "dbos": dbos_runner,
    "langgraph": langgraph_runner,
}
VERSIONS = {
    "pydantic-ai": ("pydantic-ai-slim",),
    "harness": ("candor", "pydantic-ai-slim"),
    "floor": ("candor", "pydantic-ai-slim", "asyncpg"),
    "dbos": ("dbos", "pydantic-ai-slim"),
    "langgraph": ("langgraph", "langgraph-checkpoint-postgres", "langgraph-checkpoint-sqlite"),
}


async def workload(run: Runner, clock: StepClock, command: dict[str, Any]) -> dict[str, Any]:
    steps, runs = int(command["steps"]), int(command["runs"])
    concurrency, model_seconds = int(command.get("concurrency", 1)), float(command.get("model_seconds", 0.0))
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await run(steps, model_seconds, f"{PROMPT} {uuid.uuid4().hex}")

    clock.take()  # intervals of earlier workloads' runs are theirs
    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(runs)))
    return {"seconds": time.perf_counter() - started, "completed": runs, "intervals": clock.take()}


async def serve(system: str, limits: Limits, shapes: list[Shape], threads: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=threads))
    run, close = await RUNNERS[system](limits, shapes)
    print(json.dumps({"ready": True, "versions": _versions(*VERSIONS[system])}), flush=True)
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            command = json.loads(line)
            if command.get("quit"):
                break
            print(json.dumps(await workload(run, limits.clock, command)), flush=True)
    finally:
        closed = close()
        if inspect.isawaitable(closed):
            await closed


def parse_shapes(text: str) -> list[Shape]:
    """`--shapes` ("STEPS:MODEL_SECONDS,..."), as the keys a workload command is looked up by."""
    return [(int(steps), float(seconds)) for steps, _, seconds in (shape.partition(":") for shape in text.split(","))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=sorted(RUNNERS), required=True)
    parser.add_argument("--database-url", default=None, help="postgresql://… or sqlite:///path (durable systems)")
    parser.add_argument(
        "--shapes",
        default="2:0.0,5:0.0,20:0.0,80:0.0,2:0.02,5:0.02,20:0.02,80:0.02",
        help="STEPS:MODEL_SECONDS,... the workloads that will be asked for (DBOS registers one agent per shape)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=32,
        help="the default executor's threads (a LangGraph run holds one while it runs; default 32, for 16 runs)",
    )
    parser.add_argument(
        "--connections",
        type=int,
        default=16,
        help="the connection pool of the floor and LangGraph, DBOS's system database pool (default 16)",
    )
    parser.add_argument("--durability", choices=("sync", "async"), default="sync", help="LangGraph's (default sync)")
    args = parser.parse_args()
    limits = Limits(args.database_url, args.connections, args.durability, StepClock())
    asyncio.run(serve(args.system, limits, parse_shapes(args.shapes), args.threads))


if __name__ == "__main__":
    main()
