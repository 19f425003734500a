"""Harness overhead: a scripted tool loop through `Harness.run` versus bare `Agent.run`, in one process.

Each run is a conversation of `--steps` model responses that each call one tool, then a final text answer, driven by
a `FunctionModel` (no network, so the figure is candor's own cost: boundaries, checkpoint values, recovery checks,
result building). Runs alternate between the two variants (and which goes first) to spread drift evenly. The report
gives the median of the per-pair ratios Harness/bare and each variant's median run time. Target: ratio <= 1.10.

    python -m bench.harness_overhead [--steps 20] [--reps 20] [--warmup 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from candor import Harness

from . import _cli

TARGET_RATIO = 1.10
QUICK_ARGS = ["--steps", "2", "--reps", "2", "--warmup", "0"]
"""Arguments for a smoke run (`python -m bench.run_all --quick`, tests)."""


def scripted_loop_agent(steps: int) -> Agent[None, str]:
    """An agent whose model calls `step` once per response, `steps` times, then answers."""

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(1 for m in messages if isinstance(m, ModelResponse))
        if done < steps:
            return ModelResponse(parts=[ToolCallPart("step", {"n": done}, tool_call_id=f"step_{done}")])
        return ModelResponse(parts=[TextPart(f"finished {done} steps")])

    agent: Agent[None, str] = Agent(FunctionModel(script, model_name="bench-loop"))

    @agent.tool_plain
    def step(n: int) -> int:
        """One unit of work."""
        return n + 1

    return agent


async def _timed(run: Callable[[], Awaitable[Any]]) -> float:
    gc.collect()
    started = time.perf_counter()
    await run()
    return time.perf_counter() - started


async def measure(steps: int, reps: int, warmup: int) -> dict[str, Any]:
    agent = scripted_loop_agent(steps)
    limits = UsageLimits(request_limit=steps + 10)  # pydantic-ai's default (50) would end runs of 50 steps or more
    harness = Harness(agent, usage_limits=limits)
    prompt = "Run the loop."

    async def bare() -> None:
        result = await agent.run(prompt, usage_limits=limits)
        assert result.output == f"finished {steps} steps"

    async def harnessed() -> None:
        result = await harness.run(prompt)
        assert result.status == "completed" and result.output == f"finished {steps} steps"

    for _ in range(warmup):
        await bare()
        await harnessed()

    bare_times: list[float] = []
    harness_times: list[float] = []
    for rep in range(reps):
        if rep % 2 == 0:
            bare_times.append(await _timed(bare))
            harness_times.append(await _timed(harnessed))
        else:
            harness_times.append(await _timed(harnessed))
            bare_times.append(await _timed(bare))

    ratios = [h / b for h, b in zip(harness_times, bare_times, strict=True)]
    median_ratio = statistics.median(ratios)
    return {
        "bench": "harness_overhead",
        "steps": steps,
        "reps": reps,
        "warmup": warmup,
        "bare_median_ms": statistics.median(bare_times) * 1000,
        "harness_median_ms": statistics.median(harness_times) * 1000,
        "bare_min_ms": min(bare_times) * 1000,
        "harness_min_ms": min(harness_times) * 1000,
        "median_ratio": median_ratio,
        "ratio_of_medians": statistics.median(harness_times) / statistics.median(bare_times),
        "per_step_overhead_ms": (
            (statistics.median(harness_times) - statistics.median(bare_times)) * 1000 / max(steps, 1)
        ),
        "target_ratio": TARGET_RATIO,
        "meets_target": median_ratio <= TARGET_RATIO,
    }


def report(summary: dict[str, Any]) -> str:
    verdict = "meets" if summary["meets_target"] else "MISSES"
    return "\n".join(
        [
            f"harness_overhead: {summary['steps']}-step scripted tool loop (one tool call per step), "
            f"{summary['reps']} runs per variant, alternating, after {summary['warmup']} warm-up runs each",
            f"  bare Agent.run    median {summary['bare_median_ms']:8.2f} ms   (min {summary['bare_min_ms']:.2f} ms)",
            f"  Harness.run       median {summary['harness_median_ms']:8.2f} ms   "
            f"(min {summary['harness_min_ms']:.2f} ms)",
            f"  median ratio (Harness/bare, per pair): {summary['median_ratio']:.3f}   "
            f"({verdict} the target <= {summary['target_ratio']:.2f})",
            f"  ratio of medians: {summary['ratio_of_medians']:.3f}   "
            f"overhead per step: {summary['per_step_overhead_ms']:.3f} ms",
        ]
    )


def reading(summary: dict[str, Any]) -> list[str]:
    """A short reading of the figures, for docs/benchmarks.md (derived from the data, so it stays true)."""
    verdict = "met" if summary["meets_target"] else "MISSED"
    return [
        f"`Harness.run` costs {summary['median_ratio']:.3f}x bare `Agent.run` on a {summary['steps']}-step scripted "
        f"loop (target <= {summary['target_ratio']:.2f}: {verdict}), {summary['per_step_overhead_ms']:.3f} ms per "
        "step: boundaries, state snapshots, recovery bookkeeping and result building, with no persistence at all.",
        f"The loop itself takes {summary['bare_median_ms'] / summary['steps']:.2f} ms per step without a real model, "
        "so a fixed per-step cost shows as a large ratio here; against model calls of hundreds of milliseconds "
        "the same cost would be a far smaller fraction.",
        "Where the cost goes (profiled with cProfile on 2026-12-02): every new message is still copied into the "
        "run's own history, which keeps exported states immutable (H-6, H-11), but by a copier specialised to "
        "message dataclasses and JSON (`candor.harness._detach`, several times faster than `copy.deepcopy`), and a "
        "model boundary no longer copies its pending request twice; the rest is the per-node task and event "
        "hand-over that makes boundaries wait for the consumer (H-36). Since 2026-12-03 candor adds its own "
        "capability only to runs whose hooks have work (H-84, H-107): pydantic-ai calls every hook of every "
        "capability at every step with a copy of the run context, about 4% of a bare run here (py-spy; "
        "docs/performance.md).",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.harness_overhead",
        description="Harness.run vs bare Agent.run on a scripted tool loop (same process, alternating runs).",
    )
    parser.add_argument("--steps", type=int, default=20, help="tool-calling steps per run (default: 20)")
    parser.add_argument("--reps", type=int, default=20, help="timed runs per variant (default: 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed warm-up runs per variant (default: 3)")
    _cli.add_json(parser)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.reps < 1 or args.warmup < 0:
        parser.error("--steps and --reps must be >= 1, --warmup >= 0")
    summary = asyncio.run(measure(args.steps, args.reps, args.warmup))
    return _cli.emit(summary, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
