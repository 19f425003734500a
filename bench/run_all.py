"""Run every benchmark in `bench/` and write a Markdown report: `python -m bench.run_all` (or `make bench`).

Each benchmark is a module `bench/<name>.py` with a `main()` that accepts `--json PATH` (its summary). They run one
after the other, each in its own process (`python -m bench.<name>`), so one cannot warm up or slow down another.
The report (default `docs/benchmarks.md`) records the commands, the machine (`nproc`, memory from /proc/meminfo),
the Python and package versions, and each benchmark's output.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_REPORT = REPO_ROOT / "docs" / "benchmarks.md"
NOT_BENCHMARKS = {"__init__", "run_all"}
BUDGET_SECONDS = 15 * 60
"""Issue 8: the whole `make bench` must finish within 15 minutes on the 2-core reference machine."""
ISSUE_8_LATER: dict[str, str] = {}
"""Benchmarks issue 8 asks for that may not exist yet (name -> label); the report names those still missing."""
PACKAGES = (
    "candor",
    "pydantic-ai-slim",
    "pydantic-graph",
    "pydantic",
    "pydantic-core",
    "sqlalchemy",
    "asyncpg",
    "aiosqlite",
    "rich",
)


@dataclass
class BenchRun:
    name: str
    command: list[str]
    returncode: int
    seconds: float
    stdout: str
    stderr: str
    summary: dict[str, Any] | None = field(default=None)


def discover() -> list[str]:
    """Benchmark module names: every `bench/*.py` except this runner, `__init__` and private modules."""
    return sorted(p.stem for p in BENCH_DIR.glob("*.py") if p.stem not in NOT_BENCHMARKS and not p.stem.startswith("_"))


def quick_args(name: str) -> list[str]:
    module = importlib.import_module(f"bench.{name}")
    return list(getattr(module, "QUICK_ARGS", []))


def run_bench(name: str, extra: list[str], summaries: Path | None = None) -> BenchRun:
    """Run `bench.<name>` in its own process; with `summaries`, its JSON summary is kept there as `<name>.json`."""
    with tempfile.TemporaryDirectory(prefix="candor-bench-") as tmp:
        summary_path = (summaries or Path(tmp)) / f"{name}.json"
        command = [sys.executable, "-m", f"bench.{name}", *extra]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        started = time.perf_counter()
        proc = subprocess.run(
            [*command, "--json", str(summary_path)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        elapsed = time.perf_counter() - started
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return BenchRun(name, command, proc.returncode, elapsed, proc.stdout, proc.stderr, summary)


# ------------------------------------------------------------------------------------------- machine facts


def _nproc() -> str:
    if shutil.which("nproc"):
        try:
            return subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            pass
    return str(os.cpu_count())


def _meminfo() -> str:
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
    except OSError:
        return "unknown (no /proc/meminfo)"
    total_kb = int(fields["MemTotal"].split()[0])
    available = fields.get("MemAvailable", "").split()
    text = f"{total_kb / 1024 / 1024:.1f} GiB total"
    if available:
        text += f", {int(available[0]) / 1024 / 1024:.1f} GiB available"
    return text + " (/proc/meminfo)"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _postgres_version() -> str:
    import asyncio

    from bench import _store

    url = _store.DEFAULT_POSTGRES_URL
    reason = asyncio.run(_store.postgres_unreachable(url))
    if reason is not None:
        return f"not reachable at {_store.dsn(url)} ({reason})"
    return f"{asyncio.run(_store.postgres_version(url))} at {_store.dsn(url)} (`SHOW server_version`)"


def machine_facts() -> list[tuple[str, str]]:
    versions = []
    for package in PACKAGES:
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    return [
        ("CPUs (`nproc`)", _nproc()),
        ("CPU model", _cpu_model()),
        ("Memory", _meminfo()),
        ("OS", platform.platform()),
        ("Python", f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})"),
        ("Packages", ", ".join(versions)),
        ("PostgreSQL", _postgres_version()),
        ("Commit", f"{_git_commit()} (plus any uncommitted changes in the working tree)"),
    ]


# ------------------------------------------------------------------------------------------------- report


def time_table(runs: list[BenchRun], total_seconds: float) -> list[str]:
    """Wall time per benchmark (its whole process) and the total against the `make bench` budget, as Markdown."""
    lines = ["| Benchmark | Seconds | Share | Exit status |", "|---|---|---|---|"]
    for run in runs:
        share = run.seconds / total_seconds if total_seconds > 0 else 0.0
        lines.append(f"| {run.name} | {run.seconds:.1f} | {share:.0%} | {run.returncode} |")
    within = "yes" if total_seconds <= BUDGET_SECONDS else "**no**"
    lines.append(
        f"| **Total** | **{total_seconds:.1f}** | 100% | within the {BUDGET_SECONDS / 60:.0f}-minute budget: {within} |"
    )
    return lines


def _summary_table(summary: dict[str, Any]) -> list[str]:
    if summary.get("bench") == "harness_overhead":
        verdict = "yes" if summary["meets_target"] else "**no**"
        return [
            "| Metric | Value |",
            "|---|---|",
            f"| Steps per run (one tool call each) | {summary['steps']} |",
            f"| Timed runs per variant (alternating) | {summary['reps']} "
            f"(after {summary['warmup']} warm-up runs each) |",
            f"| Bare `Agent.run`, median | {summary['bare_median_ms']:.2f} ms |",
            f"| `Harness.run`, median | {summary['harness_median_ms']:.2f} ms |",
            f"| **Median ratio Harness/bare (per pair)** | **{summary['median_ratio']:.3f}** |",
            f"| Ratio of medians | {summary['ratio_of_medians']:.3f} |",
            f"| Overhead per step | {summary['per_step_overhead_ms']:.3f} ms |",
            f"| Target | ratio <= {summary['target_ratio']:.2f}: met? {verdict} |",
        ]
    if summary.get("bench") == "checkpoint_cost":
        lines = [
            "| Backend | History (messages) | Bytes per commit | Read back by SQL | Commit ms p50 | p90 "
            "| Encode ms p50 |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in summary["results"]:
            lines.append(
                f"| {r['backend']} | {r['size']} | {r['bytes_median']:.0f} | {r['bytes_read_back_median']:.0f} | "
                f"{r['commit_ms_median']:.2f} | {r['commit_ms_p90']:.2f} | {r['encode_ms_median']:.2f} |"
            )
        lines += _verdict_lines(
            [
                (
                    f"{v['backend']}: bytes at {v['large']} <= 2x at {v['small']}",
                    f"{v['bytes_ratio']:.2f}x",
                    v["meets_bytes"],
                )
                for v in summary["verdicts"]
            ]
            + [
                (
                    f"{v['backend']}: commit time at {v['large']} <= 2x at {v['small']}",
                    f"{v['commit_time_ratio']:.2f}x",
                    v["meets_time"],
                )
                for v in summary["verdicts"]
            ],
            summary.get("skipped", {}),
        )
        return lines
    if summary.get("bench") == "durable_steps":
        lines = [
            "| Variant | Steps | Median run ms | Steps/s | Stored bytes per run | Bytes written at step 1 "
            "| at last step | Commit ms | Encode ms |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in summary["rows"]:
            lines.append(
                f"| {r['variant']} | {r['steps']} | {r['median_ms']:.2f} | {r['steps_per_s']:.1f} | "
                f"{r.get('stored_bytes', '-')} | {r.get('bytes_step_1', '-')} | {r.get('bytes_step_last', '-')} | "
                f"{_ms(r.get('commit_ms'))} | {_ms(r.get('prepare_ms'))} |"
            )
        lines += _verdict_lines(
            [(v["target"], v["value"], v["met"]) for v in summary["verdicts"]], summary.get("skipped", {})
        )
        return lines
    return ["| Key | Value |", "|---|---|", *(f"| {k} | {v} |" for k, v in summary.items())]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _verdict_lines(verdicts: list[tuple[str, str, bool]], skipped: dict[str, str]) -> list[str]:
    if not verdicts and not skipped:
        return []  # a benchmark that sets no targets (step_instructions) gets no empty table
    lines = ["", "| Target | Measured | Met? |", "|---|---|---|"]
    lines += [f"| {target} | {value} | {'yes' if met else '**no**'} |" for target, value, met in verdicts]
    lines += [f"| {name} | skipped: {reason} | not measured |" for name, reason in skipped.items()]
    return lines


def _targets(run: BenchRun) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) of one benchmark; met None when it was not measured."""
    summary = run.summary
    if summary is None:
        return [(f"{run.name}: all targets", f"no summary (exit status {run.returncode})", None)]
    bench = summary.get("bench")
    if bench == "harness_overhead":
        return [
            (
                f"Harness.run / bare Agent.run <= {summary['target_ratio']:.2f}",
                f"{summary['median_ratio']:.3f}",
                summary["meets_target"],
            )
        ]
    out: list[tuple[str, str, bool | None]] = []
    if bench == "checkpoint_cost":
        for v in summary["verdicts"]:
            out.append(
                (
                    f"{v['backend']}: bytes per commit at {v['large']} messages <= 2x at {v['small']}",
                    f"{v['bytes_ratio']:.2f}x",
                    v["meets_bytes"],
                )
            )
            out.append(
                (
                    f"{v['backend']}: commit time at {v['large']} messages <= 2x at {v['small']}",
                    f"{v['commit_time_ratio']:.2f}x",
                    v["meets_time"],
                )
            )
    else:  # durable_steps and every benchmark with a `table()`: verdicts are {target, value, met}
        out += [(v["target"], v["value"], v["met"]) for v in summary.get("verdicts", [])]
    out += [(name, f"skipped: {reason}", None) for name, reason in summary.get("skipped", {}).items()]
    return out


def render_report(runs: list[BenchRun], *, argv: list[str], total_seconds: float) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `python -m bench.run_all{' ' + ' '.join(argv) if argv else ''}`"
        f"{'' if argv else ' (`make bench`)'} on {now}, in {total_seconds:.1f} s. "
        "Regenerate it rather than editing it by hand.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        *(f"| {key} | {value} |" for key, value in machine_facts()),
        "",
        "## Targets at a glance",
        "",
        "| Benchmark | Target | Measured | Met? |",
        "|---|---|---|---|",
    ]
    for run in runs:
        for target, value, met in _targets(run):
            verdict = "not measured" if met is None else ("yes" if met else "**no**")
            lines.append(f"| {run.name} | {target} | {value} | {verdict} |")
    lines += ["", "## Time per benchmark", "", *time_table(runs, total_seconds)]
    lines += [
        "",
        "Each section below gives the command, the figures, a reading of them (including why a target is missed) "
        "and the raw output.",
        "",
    ]
    missing = [f"{label} (`bench/{name}.py`)" for name, label in ISSUE_8_LATER.items() if name not in discover()]
    if missing:
        lines += [f"Not benchmarked yet (issue 8, items 3-6): {', '.join(missing)}.", ""]
    for run in runs:
        module = importlib.import_module(f"bench.{run.name}")
        doc = (module.__doc__ or "").strip().split("\n\n")
        lines += [f"## {run.name}", ""]
        if len(doc) > 1:
            lines += [" ".join(doc[1].split()), ""]
        command = " ".join(["python", *run.command[1:]])
        lines += [f"Command: `{command}` (exit status {run.returncode}, {run.seconds:.1f} s)", ""]
        if run.summary is not None:
            table = getattr(module, "table", None)
            if table is None:
                lines += [*_summary_table(run.summary), ""]
            else:  # the benchmark renders its figures; the targets follow in the common form
                verdicts = [(v["target"], v["value"], v["met"]) for v in run.summary.get("verdicts", [])]
                lines += [*table(run.summary), *_verdict_lines(verdicts, run.summary.get("skipped", {})), ""]
            reading = getattr(module, "reading", None)
            if reading is not None:
                lines += ["Reading:", "", *(f"- {line}" for line in reading(run.summary)), ""]
        lines += ["Output:", "", "```text", run.stdout.rstrip() or "(no output)", "```", ""]
        if run.returncode != 0 and run.stderr.strip():
            lines += ["Errors:", "", "```text", run.stderr.rstrip()[-4000:], "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run_all", description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_REPORT, help=f"report file (default: {DEFAULT_REPORT})")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (each bench's QUICK_ARGS), for smoke tests")
    parser.add_argument(
        "--only", action="append", default=None, metavar="NAME", help="run only this bench (repeatable)"
    )
    parser.add_argument(
        "--summaries",
        type=Path,
        default=None,
        metavar="DIR",
        help="also keep each bench's JSON summary in DIR as NAME.json (the smoke tests read them)",
    )
    args = parser.parse_args(argv)
    raw_argv = list(argv if argv is not None else sys.argv[1:])

    names = discover()
    if args.summaries is not None:
        args.summaries.mkdir(parents=True, exist_ok=True)
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            parser.error(f"unknown bench(es): {', '.join(unknown)}; available: {', '.join(names)}")
        names = [n for n in names if n in args.only]

    console = Console(stderr=True)
    runs: list[BenchRun] = []
    started = time.perf_counter()
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("benchmarks", total=len(names))
        for name in names:
            progress.update(task, description=f"running bench.{name}")
            run = run_bench(name, quick_args(name) if args.quick else [], args.summaries)
            runs.append(run)
            progress.advance(task)
            progress.console.print(f"[bold]{name}[/bold] (exit {run.returncode}, {run.seconds:.1f} s)")
            progress.console.print(run.stdout.rstrip(), markup=False, highlight=False)
        progress.update(task, description="benchmarks done")

    total_seconds = time.perf_counter() - started
    report = render_report(runs, argv=raw_argv, total_seconds=total_seconds)
    for line in time_table(runs, total_seconds):
        console.print(line, markup=False, highlight=False)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report, encoding="utf-8")
    console.print(f"report written to {args.output}")
    return 0 if all(run.returncode == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
