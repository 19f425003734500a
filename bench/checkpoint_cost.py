"""Checkpoint cost: bytes written and time per checkpoint commit as the history grows, on SQLite and PostgreSQL.

For each history length (10, 100, 1000 messages by default) a run is created and claimed (a real lease), its first
checkpoint stores the whole history, and then `--commits` more commits each extend it by one step (a model response
with a tool call plus a 200-byte tool return), all through the fenced `commit_checkpoint` the worker uses. Per
length it reports, over those incremental commits: bytes written (`CommitResult.bytes_written`, cross-checked
against the stored payload read back by SQL), the median and p90 time of the `commit_checkpoint` call, and the
median time of encoding the history first (`encode_history_reusing`: only messages not encoded at the previous
commit, as a worker boundary does).
Target: bytes and commit time at 1000 messages <= 2x those at 10.

    python -m bench.checkpoint_cost [--sizes 10,100,1000] [--commits 30] [--backends sqlite,postgresql] [--json out]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart

from candor import HarnessState
from candor.service.store.attempts.seals import commit_checkpoint
from candor.service.store.checkpoints.incremental import (
    EncodedMessage,
    encode_envelope,
    encode_history_reusing,
    envelope_for_state,
)

from . import _cli, _store

TARGET_RATIO = 2.0
TOOL_RESULT = "r" * 200
QUICK_ARGS = ["--sizes", "4,8", "--commits", "3", "--backends", "sqlite"]
"""Arguments for a smoke run (`python -m bench.run_all --quick`, tests)."""


def step_messages(n: int) -> list[ModelMessage]:
    """One agent step: a response calling `step`, then the request carrying its 200-byte result."""
    call_id = f"call_{n:06d}"
    return [
        ModelResponse(parts=[ToolCallPart("step", {"n": n}, tool_call_id=call_id)], model_name="bench-loop"),
        ModelRequest(parts=[ToolReturnPart("step", TOOL_RESULT, tool_call_id=call_id)]),
    ]


def history_of(length: int) -> list[ModelMessage]:
    """A prompt followed by steps, cut to `length` messages."""
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("Run the loop.")])]
    n = 0
    while len(messages) < length:
        messages.extend(step_messages(n))
        n += 1
    return messages[:length]


async def measure_size(store: _store.Store, size: int, commits: int) -> dict[str, Any]:
    agent = f"bench_cost_{size}"
    workspace_id, principal_id = await _store.add_tenant(store.engine)
    thread_id, run_id = await _store.add_thread_run(store.engine, workspace_id, principal_id, agent)
    lease = await _store.claim(store.engine, agent, run_id)
    history = history_of(size)
    empty_state = HarnessState.new(thread_id)
    base_id: str | None = None
    base_encoded: list[EncodedMessage] = []
    base_messages: tuple[ModelMessage, ...] = ()
    seq = 0
    encode_ms: list[float] = []
    commit_ms: list[float] = []
    written: list[int] = []
    read_back: list[int] = []
    rows: list[int] = []
    first_bytes = 0
    for index in range(commits + 1):
        if index > 0:
            history.extend(step_messages(10_000 + index))
        gc.collect()
        started = time.perf_counter()
        encoded = encode_history_reusing(history, base_messages, base_encoded)
        envelope = encode_envelope(envelope_for_state(empty_state))  # capabilities and environment only
        encoded_at = time.perf_counter()
        before = await _store.stored_bytes(store, thread_id) if index > 0 else 0
        committed_at = time.perf_counter()
        result = await commit_checkpoint(
            store.engine,
            lease,
            expected_seq=seq,
            base_id=base_id,
            base_encoded=base_encoded,
            new_encoded=encoded,
            envelope=envelope,
        )
        committed = time.perf_counter()
        after = await _store.stored_bytes(store, thread_id)
        base_id, base_encoded, seq = result.checkpoint_id, encoded, result.seq
        base_messages = tuple(history)
        if index == 0:
            first_bytes = result.bytes_written
            continue
        encode_ms.append((encoded_at - started) * 1000)
        commit_ms.append((committed - committed_at) * 1000)
        written.append(result.bytes_written)
        read_back.append(after - before)
        rows.append(result.count - result.kept)
    return {
        "backend": store.backend,
        "size": size,
        "commits": commits,
        "first_commit_bytes": first_bytes,
        "bytes_median": statistics.median(written),
        "bytes_read_back_median": statistics.median(read_back),
        "rows_per_commit": statistics.median(rows),
        "commit_ms_median": statistics.median(commit_ms),
        "commit_ms_p90": _store.percentile(commit_ms, 0.9),
        "encode_ms_median": statistics.median(encode_ms),
    }


async def measure(sizes: list[int], commits: int, backends: list[str], postgres_url: str) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    versions: dict[str, str] = {}
    for backend in backends:
        if backend == "postgresql":
            reason = await _store.postgres_unreachable(postgres_url)
            if reason is not None:
                skipped[backend] = f"PostgreSQL not reachable at {_store.dsn(postgres_url)}: {reason}"
                continue
            versions[backend] = await _store.postgres_version(postgres_url)
        async with _store.candor_store(backend, postgres_url) as store:
            await measure_size(store, min(sizes), 3)  # warm-up: connections, statement caches
            for size in sizes:
                results.append(await measure_size(store, size, commits))
    verdicts = []
    for backend in backends:
        rows = [r for r in results if r["backend"] == backend]
        if len(rows) < 2:
            continue
        small, large = min(rows, key=lambda r: r["size"]), max(rows, key=lambda r: r["size"])
        bytes_ratio = large["bytes_median"] / small["bytes_median"]
        time_ratio = large["commit_ms_median"] / small["commit_ms_median"]
        boundary_ratio = (large["commit_ms_median"] + large["encode_ms_median"]) / (
            small["commit_ms_median"] + small["encode_ms_median"]
        )
        verdicts.append(
            {
                "backend": backend,
                "small": small["size"],
                "large": large["size"],
                "bytes_ratio": bytes_ratio,
                "commit_time_ratio": time_ratio,
                "boundary_time_ratio": boundary_ratio,
                "meets_bytes": bytes_ratio <= TARGET_RATIO,
                "meets_time": time_ratio <= TARGET_RATIO,
            }
        )
    return {
        "bench": "checkpoint_cost",
        "sizes": sizes,
        "commits": commits,
        "results": results,
        "verdicts": verdicts,
        "skipped": skipped,
        "postgres_version": versions.get("postgresql"),
        "target_ratio": TARGET_RATIO,
    }


def report(summary: dict[str, Any]) -> str:
    lines = [
        f"checkpoint_cost: {summary['commits']} incremental commits (one step = 2 messages each) per history length, "
        "through the fenced commit_checkpoint",
        f"  {'backend':<11}{'history':>8}{'bytes/commit':>14}{'read back':>11}{'rows':>6}"
        f"{'commit ms p50':>15}{'p90':>8}{'encode ms p50':>15}{'first commit B':>16}",
    ]
    for r in summary["results"]:
        lines.append(
            f"  {r['backend']:<11}{r['size']:>8}{r['bytes_median']:>14.0f}{r['bytes_read_back_median']:>11.0f}"
            f"{r['rows_per_commit']:>6.0f}{r['commit_ms_median']:>15.2f}{r['commit_ms_p90']:>8.2f}"
            f"{r['encode_ms_median']:>15.2f}{r['first_commit_bytes']:>16}"
        )
    for v in summary["verdicts"]:
        ok = lambda flag: "meets" if flag else "MISSES"  # noqa: E731
        lines.append(
            f"  {v['backend']}: {v['large']} vs {v['small']} messages: bytes x{v['bytes_ratio']:.2f} "
            f"({ok(v['meets_bytes'])} <= {summary['target_ratio']:.0f}x), commit time x{v['commit_time_ratio']:.2f} "
            f"({ok(v['meets_time'])} <= {summary['target_ratio']:.0f}x); with full-history encoding "
            f"x{v['boundary_time_ratio']:.2f} (no target)"
        )
    for backend, reason in summary["skipped"].items():
        lines.append(f"  {backend}: SKIPPED ({reason})")
    if summary.get("postgres_version"):
        lines.append(f"  PostgreSQL server {summary['postgres_version']}")
    return "\n".join(lines)


def reading(summary: dict[str, Any]) -> list[str]:
    """A short reading of the figures, for docs/benchmarks.md (derived from the data, so it stays true)."""
    out: list[str] = []
    results = summary["results"]
    for v in summary["verdicts"]:
        rows = sorted((r for r in results if r["backend"] == v["backend"]), key=lambda r: r["size"])
        small, large = rows[0], rows[-1]
        out.append(
            f"{v['backend']}: an incremental commit writes {small['bytes_median']:.0f} B at {small['size']} messages "
            f"and {large['bytes_median']:.0f} B at {large['size']} (x{v['bytes_ratio']:.2f}; target <= 2x "
            f"{'met' if v['meets_bytes'] else 'MISSED'}): only the {large['rows_per_commit']:.0f} new messages "
            "(packed in the checkpoint row) and the envelope are written, and the bytes read back by SQL agree "
            "with what the commit reported."
        )
        out.append(
            f"{v['backend']}: the `commit_checkpoint` call takes {small['commit_ms_median']:.2f} ms (p50) at "
            f"{small['size']} messages and {large['commit_ms_median']:.2f} ms at {large['size']} "
            f"(x{v['commit_time_ratio']:.2f}; target <= 2x {'met' if v['meets_time'] else 'MISSED'}). p90 is "
            f"{large['commit_ms_p90']:.2f} ms: single commits vary with fsync and scheduling on this 2-core machine."
        )
        out.append(
            f"{v['backend']}: not covered by the target, but part of every worker boundary: encoding the "
            f"history (`encode_history_reusing`) before the commit takes {small['encode_ms_median']:.2f} ms at "
            f"{small['size']} messages and {large['encode_ms_median']:.2f} ms at {large['size']}, so the boundary "
            f"as a whole grows x{v['boundary_time_ratio']:.2f}; at {large['size']} messages the encoding costs "
            f"{large['encode_ms_median'] / large['commit_ms_median']:.1f}x the commit (only the messages added since "
            "the previous checkpoint are encoded; the rest is the identity check of the kept prefix)."
        )
    for backend, reason in summary["skipped"].items():
        out.append(f"{backend}: not measured ({reason}).")
    out.append(
        "The first commit of each run stores the whole starting history once (last column of the output), which is "
        "why it grows with the length; every later commit stores only what was added."
    )
    return out


def _backends(text: str) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    unknown = set(values) - set(_store.BACKENDS)
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(_store.BACKENDS)}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.checkpoint_cost",
        description="Bytes written and time per fenced checkpoint commit at growing history lengths.",
    )
    parser.add_argument(
        "--sizes",
        type=_cli.positive_ints,
        default=[10, 100, 1000],
        help="history lengths in messages (default: 10,100,1000)",
    )
    parser.add_argument("--commits", type=int, default=30, help="incremental commits measured per length (default: 30)")
    parser.add_argument(
        "--backends",
        type=_backends,
        default=list(_store.BACKENDS),
        help="comma-separated: sqlite,postgresql (default: both)",
    )
    _cli.add_postgres_url(parser)
    _cli.add_json(parser)
    args = parser.parse_args(argv)
    if args.commits < 1:
        parser.error("--commits must be >= 1")
    summary = asyncio.run(measure(args.sizes, args.commits, args.backends, args.postgres_url))
    return _cli.emit(summary, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
