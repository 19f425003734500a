"""Durable step throughput and storage growth: candor vs bare Pydantic AI vs LangGraph checkpointers (issue 8, 1–2).

One scripted agent loop: each step the model (a pydantic-ai `FunctionModel`; LangGraph: a scripted node) asks for
one `step` tool call whose result is 200 bytes, then the final answer; 5 / 20 / 80 steps per run, `--runs` timed
runs each after a warm-up run. Variants: bare `Agent.run` (no persistence); candor `Harness.stream` with a
checkpoint committed through the service store's fenced `commit_checkpoint` at every `BoundaryEvent` (as the
worker does: full state export, history encoding, one usage record per commit, then the final commit that seals
the run `completed`), on PostgreSQL and on SQLite, each run a fresh thread and run row claimed with a real lease
(row creation untimed; claim, attempt start, all commits and the seal timed); LangGraph with `PostgresSaver` and
`SqliteSaver` (`durability="sync"`), run by `bench/peers/langgraph_steps.py` in the separate peers venv
(`make bench-peers`); and on PostgreSQL the floor, `floor+postgresql` (bench/_floor_commit.py): the same Harness,
state export and history encoding at every boundary, waiting each time for a write that is only a bare INSERT of
the new messages, so that candor's fenced commit can be told from what any synchronous write on this stack costs.
Steps/s = steps / median run time. Storage: checkpoint payload bytes stored per run, and bytes
written at step k (stored bytes once the k-th tool result is durable minus once the (k-1)-th was), both read back
by SQL from one extra untimed run. For candor the output also splits a boundary's cost: `commit ms`, the mean time
inside one `commit_checkpoint` call, and `encode ms`, the mean time exporting the state and encoding history and
envelope before it (medians over the timed runs). Targets: candor on PostgreSQL >= 0.8x bare Pydantic AI and
>= 1.5x LangGraph + PostgresSaver (steps/s, 80 steps); candor stores <= 1/20 of LangGraph's bytes for an 80-step
run (PostgreSQL), and its write at step 80 is <= 2x its write at step 5.

    python -m bench.durable_steps [--steps 5,20,80] [--runs 5] [--backends sqlite,postgresql] [--no-langgraph]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from candor import BoundaryEvent, Harness, HarnessState
from candor.service.store.attempts.seals import SealRequest, commit_checkpoint
from candor.service.store.checkpoints.incremental import (
    EncodedMessage,
    encode_envelope,
    encode_history_reusing,
    envelope_for_state,
)
from candor.service.worker.inputs import usage_json

from . import _cli, _store
from ._floor_commit import FloorSide

TOOL_RESULT = "r" * 200
PROMPT = "Run the loop."
TARGET_VS_BARE = 0.8
TARGET_VS_LANGGRAPH = 1.5
TARGET_STORAGE_FRACTION = 1 / 20
TARGET_WRITE_GROWTH = 2.0
PEERS_SCRIPT = Path(__file__).resolve().parent / "peers" / "langgraph_steps.py"
QUICK_ARGS = ["--steps", "2,3", "--runs", "1", "--backends", "sqlite", "--no-langgraph"]
"""Arguments for a smoke run (`python -m bench.run_all --quick`, tests)."""


def scripted_agent(steps: int) -> Agent[None, str]:
    """The model calls `step` once per response, `steps` times, then answers; `step` returns 200 bytes."""

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(1 for m in messages if isinstance(m, ModelResponse))
        if done < steps:
            return ModelResponse(parts=[ToolCallPart("step", {"n": done}, tool_call_id=f"call_{done:06d}")])
        return ModelResponse(parts=[TextPart(f"finished {done} steps")])

    agent: Agent[None, str] = Agent(FunctionModel(script, model_name="bench-loop"))

    @agent.tool_plain
    def step(n: int) -> str:
        """One unit of work."""
        return TOOL_RESULT

    return agent


def limits(steps: int) -> UsageLimits:
    """Room for `steps` tool calls plus the answer (pydantic-ai's default request_limit is 50)."""
    return UsageLimits(request_limit=steps + 10)


async def bare_run(agent: Agent[None, str], steps: int) -> float:
    gc.collect()
    started = time.perf_counter()
    result = await agent.run(PROMPT, usage_limits=limits(steps))
    elapsed = time.perf_counter() - started
    assert result.output == f"finished {steps} steps", result.output
    return elapsed


class CandorSide:
    """Runs of one agent on one candor store, each a new thread + run, claimed and committed at every boundary."""

    def __init__(self, store: _store.Store, steps: int) -> None:
        self.store = store
        self.steps = steps
        self.agent_name = f"bench_steps_{steps}"
        self.harness = Harness(scripted_agent(steps), usage_limits=limits(steps))
        self.tenant: tuple[str, str] | None = None
        self.commits = 0
        """Checkpoint commits of the last run (boundaries plus the final sealing commit)."""
        self.commit_ms: list[float] = []
        """Per timed run: mean milliseconds inside one `commit_checkpoint` call (the fenced transaction)."""
        self.prepare_ms: list[float] = []
        """Per timed run: mean milliseconds per boundary exporting the state and encoding history and envelope."""

    async def run(self, *, probe: list[tuple[int, int]] | None = None) -> tuple[str, float]:
        engine = self.store.engine
        if self.tenant is None:
            self.tenant = await _store.add_tenant(engine)
        thread_id, run_id = await _store.add_thread_run(engine, *self.tenant, self.agent_name)
        gc.collect()
        started = time.perf_counter()
        lease = await _store.claim(engine, self.agent_name, run_id)
        seq, base_id = 0, None
        base_encoded: list[EncodedMessage] = []
        base_messages: tuple[Any, ...] = ()
        recorded = None
        commits = 0
        in_commit = in_prepare = 0.0
        stream = self.harness.stream(PROMPT, previous_state=HarnessState.new(thread_id), tool_recovery="declared")
        async with stream:
            async for event in stream:
                if not isinstance(event, BoundaryEvent):
                    continue
                prepare_started = time.perf_counter()
                state = await stream.export_state()
                envelope = encode_envelope(envelope_for_state(state))
                history = state._history_ref()
                encoded = encode_history_reusing(history, base_messages, base_encoded)  # as the worker does (§6)
                usage = stream.usage
                commit_started = time.perf_counter()
                in_prepare += commit_started - prepare_started
                result = await commit_checkpoint(
                    engine,
                    lease,
                    expected_seq=seq,
                    base_id=base_id,
                    base_encoded=base_encoded,
                    new_encoded=encoded,
                    envelope=envelope,
                    incorporated_keys=event.incorporated_keys,
                    source_entry_consumed=seq == 0,
                    usage=usage_json(usage if recorded is None else usage - recorded),
                )
                in_commit += time.perf_counter() - commit_started
                seq, base_id, base_encoded, recorded = result.seq, result.checkpoint_id, encoded, usage
                base_messages = history
                commits += 1
                if probe is not None:
                    probe.append((len(encoded), await _store.stored_bytes(self.store, thread_id)))
        outcome = stream.outcome
        assert outcome is not None and outcome.status == "completed", outcome
        assert outcome.output == f"finished {self.steps} steps", outcome.output
        assert outcome.state is not None
        state = outcome.state
        encoded = encode_history_reusing(state._history_ref(), base_messages, base_encoded)
        await commit_checkpoint(
            engine,
            lease,
            expected_seq=seq,
            base_id=base_id,
            base_encoded=base_encoded,
            new_encoded=encoded,
            envelope=encode_envelope(envelope_for_state(state)),
            source_entry_consumed=seq == 0,
            usage=usage_json(outcome.usage - recorded) if recorded is not None else None,
            seal=SealRequest(status="completed", output=outcome.output),
        )
        elapsed = time.perf_counter() - started
        self.commits = commits + 1
        if probe is None:
            self.commit_ms.append(in_commit * 1000 / commits)
            self.prepare_ms.append(in_prepare * 1000 / commits)
        return thread_id, elapsed

    async def storage(self) -> dict[str, Any]:
        probe: list[tuple[int, int]] = []
        thread_id, _ = await self.run(probe=probe)
        at_count = {count: total for count, total in probe}
        cumulative = [at_count.get(1 + 2 * k, 0) for k in range(self.steps + 1)]
        return {
            "stored_bytes": await _store.stored_bytes(self.store, thread_id),
            "cumulative_bytes": cumulative,
            "writes_per_run": self.commits,
            "commit_ms": statistics.median(self.commit_ms[1:] or self.commit_ms),
            "prepare_ms": statistics.median(self.prepare_ms[1:] or self.prepare_ms),
        }


def _langgraph(
    steps: list[int], runs: int, postgres_url: str, backends: list[str]
) -> tuple[dict[str, Any] | None, str]:
    python = _store.peers_python()
    if not python.exists():
        return None, f"peers venv missing: {python} does not exist (build it with `make bench-peers`)"
    lg_backends = ",".join(b for b in ("postgresql", "sqlite") if b in backends)
    command = [
        str(python),
        str(PEERS_SCRIPT),
        "--steps",
        ",".join(map(str, steps)),
        "--runs",
        str(runs),
        "--backends",
        lg_backends,
        "--postgres-url",
        _store.dsn(postgres_url),
    ]
    return _store.run_json(command, timeout=900)


def _per_step(cumulative: list[int]) -> list[int]:
    return [cumulative[k] - cumulative[k - 1] for k in range(1, len(cumulative))]


async def measure(
    steps_list: list[int], runs: int, backends: list[str], postgres_url: str, langgraph: bool
) -> dict[str, Any]:
    skipped: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    pg_version = None
    if "postgresql" in backends:
        reason = await _store.postgres_unreachable(postgres_url)
        if reason is not None:
            skipped["candor+postgresql"] = f"PostgreSQL not reachable at {_store.dsn(postgres_url)}: {reason}"
            backends = [b for b in backends if b != "postgresql"]
        else:
            pg_version = await _store.postgres_version(postgres_url)

    stores: dict[str, _store.Store] = {}
    contexts = []
    floors: list[FloorSide] = []

    async def close_floors() -> None:
        while floors:
            await floors.pop().close()

    try:
        for backend in backends:
            context = _store.candor_store(backend, postgres_url)
            stores[backend] = await context.__aenter__()
            contexts.append(context)
        for steps in steps_list:
            agent = scripted_agent(steps)
            sides: dict[str, CandorSide | FloorSide] = {
                f"candor+{backend}": CandorSide(store, steps) for backend, store in stores.items()
            }
            if "postgresql" in stores:
                floors.append(FloorSide(stores["postgresql"].url, agent, limits(steps), PROMPT))
                sides["floor+postgresql"] = floors[-1]
            await bare_run(agent, steps)  # warm-up
            for side in sides.values():
                await side.run()
            times: dict[str, list[float]] = {"pydantic-ai": [], **{name: [] for name in sides}}
            for rep in range(runs):
                order = ["pydantic-ai", *sides]
                order = order[rep % len(order) :] + order[: rep % len(order)]  # rotate to spread drift
                for name in order:
                    if name == "pydantic-ai":
                        times[name].append(await bare_run(agent, steps))
                    else:
                        times[name].append((await sides[name].run())[1])
            for name, values in times.items():
                row: dict[str, Any] = {"variant": name, "steps": steps, "run_seconds": values}
                candor_side = sides.get(name)
                if isinstance(candor_side, CandorSide):
                    row.update(await candor_side.storage())
                rows.append(row)
            await close_floors()
            print(f"candor/bare {steps} steps done", file=sys.stderr, flush=True)
    finally:
        await close_floors()
        for context in reversed(contexts):
            await context.__aexit__(None, None, None)

    peers: dict[str, Any] | None = None
    if langgraph:
        peers, error = _langgraph(steps_list, runs, postgres_url, backends or ["sqlite"])
        if peers is None:
            skipped["langgraph"] = error
        else:
            for backend, reason in peers.get("skipped", {}).items():
                skipped[f"langgraph+{backend}"] = reason
            for result in peers["results"]:
                rows.append(
                    {
                        "variant": f"langgraph+{result['backend']}",
                        "steps": result["steps"],
                        "run_seconds": result["run_seconds"],
                        "stored_bytes": result["stored_bytes"],
                        "cumulative_bytes": result["cumulative_bytes"],
                        "writes_per_run": result.get("puts"),
                    }
                )
    else:
        skipped["langgraph"] = "--no-langgraph given"

    for row in rows:
        row["median_ms"] = statistics.median(row["run_seconds"]) * 1000
        row["steps_per_s"] = row["steps"] / statistics.median(row["run_seconds"])
        if "cumulative_bytes" in row:
            per_step = _per_step(row["cumulative_bytes"])
            row["step_bytes"] = per_step
            row["bytes_step_1"] = per_step[0] if per_step else None
            row["bytes_step_last"] = per_step[-1] if per_step else None
    return {
        "bench": "durable_steps",
        "steps": steps_list,
        "runs": runs,
        "rows": rows,
        "skipped": skipped,
        "postgres_version": pg_version,
        "peers_versions": (peers or {}).get("versions"),
        "verdicts": verdicts(rows, steps_list),
    }


def _row(rows: list[dict[str, Any]], variant: str, steps: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["variant"] == variant and r["steps"] == steps), None)


def verdicts(rows: list[dict[str, Any]], steps_list: list[int]) -> list[dict[str, Any]]:
    """The issue's targets, at the largest step count measured; only those whose inputs were measured."""
    top, low = max(steps_list), min(steps_list)
    out: list[dict[str, Any]] = []
    pg, bare = _row(rows, "candor+postgresql", top), _row(rows, "pydantic-ai", top)
    lg = _row(rows, "langgraph+postgresql", top)
    if pg and bare:
        ratio = pg["steps_per_s"] / bare["steps_per_s"]
        out.append(
            {
                "target": f"candor+postgresql steps/s >= {TARGET_VS_BARE}x pydantic-ai ({top} steps)",
                "value": f"{ratio:.3f}x",
                "met": ratio >= TARGET_VS_BARE,
            }
        )
    if pg and lg:
        ratio = pg["steps_per_s"] / lg["steps_per_s"]
        out.append(
            {
                "target": f"candor+postgresql steps/s >= {TARGET_VS_LANGGRAPH}x langgraph+postgresql ({top} steps)",
                "value": f"{ratio:.3f}x",
                "met": ratio >= TARGET_VS_LANGGRAPH,
            }
        )
        fraction = pg["stored_bytes"] / lg["stored_bytes"]
        out.append(
            {
                "target": f"candor+postgresql bytes per {top}-step run <= 1/20 of langgraph+postgresql",
                "value": f"1/{1 / fraction:.1f} ({pg['stored_bytes']} vs {lg['stored_bytes']} B)",
                "met": fraction <= TARGET_STORAGE_FRACTION,
            }
        )
    for backend in ("postgresql", "sqlite"):
        side = _row(rows, f"candor+{backend}", top)
        if side and side.get("step_bytes") and top >= low and len(side["step_bytes"]) >= min(5, top):
            at_5 = side["step_bytes"][min(5, top) - 1]
            at_top = side["step_bytes"][-1]
            ratio = at_top / at_5
            out.append(
                {
                    "target": f"candor+{backend} write at step {top} <= {TARGET_WRITE_GROWTH:.0f}x write at step "
                    f"{min(5, top)}",
                    "value": f"{ratio:.2f}x ({at_top} vs {at_5} B)",
                    "met": ratio <= TARGET_WRITE_GROWTH,
                }
            )
    return out


def report(summary: dict[str, Any]) -> str:
    rows = summary["rows"]
    lines = [
        f"durable_steps: scripted loop, one tool call per step (200-byte result), {summary['runs']} timed runs per "
        "variant and step count (after 1 warm-up); steps/s = steps / median run time",
        f"  {'variant':<22}{'steps':>6}{'median ms':>11}{'steps/s':>10}{'x bare':>8}{'x LG+pg':>9}"
        f"{'stored B/run':>14}{'B step 1':>10}{'B last step':>12}{'commit ms':>11}{'encode ms':>11}",
    ]
    for steps in summary["steps"]:
        bare = _row(rows, "pydantic-ai", steps)
        lg = _row(rows, "langgraph+postgresql", steps)
        for row in (r for r in rows if r["steps"] == steps):
            vs_bare = f"{row['steps_per_s'] / bare['steps_per_s']:.3f}" if bare else "-"
            vs_lg = f"{row['steps_per_s'] / lg['steps_per_s']:.3f}" if lg else "-"
            stored = f"{row['stored_bytes']}" if "stored_bytes" in row else "-"
            first = f"{row['bytes_step_1']}" if row.get("bytes_step_1") is not None else "-"
            last = f"{row['bytes_step_last']}" if row.get("bytes_step_last") is not None else "-"
            commit = f"{row['commit_ms']:.2f}" if "commit_ms" in row else "-"
            prepare = f"{row['prepare_ms']:.2f}" if "prepare_ms" in row else "-"
            lines.append(
                f"  {row['variant']:<22}{steps:>6}{row['median_ms']:>11.2f}{row['steps_per_s']:>10.1f}{vs_bare:>8}"
                f"{vs_lg:>9}{stored:>14}{first:>10}{last:>12}{commit:>11}{prepare:>11}"
            )
    lines.extend(_cli.target_lines(summary))
    if summary.get("peers_versions"):
        lines.append("  peers: " + ", ".join(f"{k} {v}" for k, v in summary["peers_versions"].items()))
    if summary.get("postgres_version"):
        lines.append(f"  PostgreSQL server {summary['postgres_version']}")
    return "\n".join(lines)


def reading(summary: dict[str, Any]) -> list[str]:
    """A short reading of the figures, for docs/benchmarks.md (derived from the data, so it stays true)."""
    rows, top = summary["rows"], max(summary["steps"])
    out: list[str] = []
    bare = _row(rows, "pydantic-ai", top)
    for backend in ("postgresql", "sqlite"):
        side = _row(rows, f"candor+{backend}", top)
        if side is None or bare is None:
            continue
        extra = (side["median_ms"] - bare["median_ms"]) / top
        per_write = (side["median_ms"] - bare["median_ms"]) / side["writes_per_run"]
        out.append(
            f"candor+{backend}, {top} steps: {side['steps_per_s']:.1f} steps/s against {bare['steps_per_s']:.1f} for "
            f"bare Pydantic AI ({side['steps_per_s'] / bare['steps_per_s']:.3f}x). The run takes {extra:.2f} ms "
            f"more per step (harness, claim, attempt start, commits, seal); spread over its {side['writes_per_run']} "
            f"fenced commits (two boundaries per step plus the sealing commit) that is {per_write:.2f} ms each, of "
            f"which {side['commit_ms']:.2f} ms inside `commit_checkpoint` and {side['prepare_ms']:.2f} ms exporting "
            "and encoding the state. The "
            f"scripted model answers at once, so bare Pydantic AI spends only {bare['median_ms'] / top:.2f} ms per "
            "step and two synchronous database transactions per step dominate; the ratio says nothing yet about "
            "runs whose model calls take hundreds of milliseconds."
        )
    for backend in ("postgresql", "sqlite"):
        side, lg = _row(rows, f"candor+{backend}", top), _row(rows, f"langgraph+{backend}", top)
        if side is None or lg is None:
            continue
        out.append(
            f"{backend}, {top} steps: candor {side['steps_per_s']:.1f} steps/s vs LangGraph "
            f"{lg['steps_per_s']:.1f} ({side['steps_per_s'] / lg['steps_per_s']:.3f}x). LangGraph makes "
            f"{lg['writes_per_run']} checkpoint puts per run at {lg['median_ms'] / lg['writes_per_run']:.2f} ms of "
            f"run time each; candor spends {side['median_ms'] / side['writes_per_run']:.2f} ms of run time per "
            f"commit, of which {side['commit_ms']:.2f} ms inside `commit_checkpoint` (a fenced commit: "
            + (
                "for a plain step one INSERT of the checkpoint row, with its new messages and usage packed in it, "
                "fenced by its own WHERE; "
                if backend == "postgresql"
                else "for a plain step a `BEGIN IMMEDIATE` transaction around the same fenced INSERT; "
            )
            + "a LangGraph put upserts the checkpoint and its blobs) and "
            f"{side['prepare_ms']:.2f} ms exporting the state and encoding the whole history for it."
        )
        out.append(
            f"{backend}, storage for {top} steps: candor stores {side['stored_bytes']} B per run, LangGraph "
            f"{lg['stored_bytes']} B (candor = 1/{lg['stored_bytes'] / side['stored_bytes']:.1f}). Candor writes "
            f"{side['bytes_step_1']} B at step 1 and {side['bytes_step_last']} B at step {top} (flat: new messages "
            f"plus a small envelope); LangGraph writes {lg['bytes_step_1']} B at step 1 and {lg['bytes_step_last']} "
            f"B at step {top}, because every checkpoint stores the whole message list again, so its total grows "
            "with the square of the run length while candor's grows linearly."
        )
    out.extend(_floor_lines(rows, top))
    out.extend(_cli.missed_lines(summary, why="; see the readings above for why"))
    return out


def _floor_lines(rows: list[dict[str, Any]], top: int) -> list[str]:
    """What the floor variant (bench/_floor_commit.py) says of candor's commit against LangGraph's stack."""
    floor, side = _row(rows, "floor+postgresql", top), _row(rows, "candor+postgresql", top)
    if floor is None or side is None:
        return []
    boundaries = side["writes_per_run"]
    added = (side["median_ms"] - floor["median_ms"]) / boundaries
    text = (
        f"floor+postgresql, {top} steps: {floor['steps_per_s']:.1f} steps/s: the same Harness, state export and "
        "encoding at every boundary, waiting for a write each time, but the write a bare INSERT of the new messages "
        "(one autocommit statement on asyncpg into a table without key, index, constraint or trigger: "
        f"bench/_floor_commit.py). candor's fenced commit costs {added:.2f} ms of run time more per boundary than "
        f"that write ({side['steps_per_s'] / floor['steps_per_s']:.2f}x the floor's steps/s)"
    )
    lg = _row(rows, "langgraph+postgresql", top)
    if lg is not None:
        text += (
            f"; the floor itself makes {floor['steps_per_s'] / lg['steps_per_s']:.2f}x LangGraph + PostgresSaver's "
            "steps/s (LangGraph runs after the other variants here, not between them: `service_steps` interleaves "
            "the floor with the peers in every round)"
        )
    return [text + "."]


def _backends(text: str) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values or set(values) - set(_store.BACKENDS):
        raise argparse.ArgumentTypeError(f"choose from {', '.join(_store.BACKENDS)}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.durable_steps",
        description="Durable step throughput and storage: candor vs bare Pydantic AI vs LangGraph checkpointers.",
    )
    parser.add_argument(
        "--steps", type=_cli.positive_ints, default=[5, 20, 80], help="steps per run (default: 5,20,80)"
    )
    parser.add_argument("--runs", type=int, default=5, help="timed runs per variant and step count (default: 5)")
    parser.add_argument(
        "--backends",
        type=_backends,
        default=list(_store.BACKENDS),
        help="stores for candor and LangGraph: sqlite,postgresql (default: both)",
    )
    parser.add_argument(
        "--no-langgraph",
        action="store_true",
        help="skip the LangGraph side (no peers venv needed), e.g. for smoke tests",
    )
    _cli.add_postgres_url(parser)
    _cli.add_json(parser)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    summary = asyncio.run(measure(args.steps, args.runs, args.backends, args.postgres_url, not args.no_langgraph))
    return _cli.emit(summary, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
