"""What every benchmark script's command line and report share: option types, the `--postgres-url`/`--json`
options, the target and skip lines, and printing the report and writing the JSON summary `bench.run_all` reads."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from . import _store

__all__ = (
    "positive_ints",
    "add_postgres_url",
    "add_json",
    "add_baseline_src",
    "candor_source",
    "target_lines",
    "missed_lines",
    "emit",
)


def positive_ints(text: str) -> list[int]:
    """An argparse type: a comma-separated list of positive integers (`1,8,32`)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers")
    return values


def add_postgres_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--postgres-url",
        default=_store.DEFAULT_POSTGRES_URL,
        help="PostgreSQL server on which scratch databases are created and dropped "
        "(default: $CANDOR_BENCH_POSTGRES_URL or postgresql://postgres@127.0.0.1:5432/test)",
    )


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, default=None, help="also write the summary as JSON to this file")


def candor_source(text: str) -> Path:
    """An argparse type: a directory holding the `candor` package (a `src` directory). Anything else would
    silently import this checkout's candor instead, measuring it against itself."""
    path = Path(text).resolve()
    if not (path / "candor" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{text} holds no candor package (give the `src` directory)")
    return path


def add_baseline_src(parser: argparse.ArgumentParser, what: str) -> None:
    """`--baseline-src DIR`: another candor `src` directory (e.g. `git archive main src | tar -x -C /tmp/base`)
    whose code some service processes import instead of this checkout's, for before/after figures in one run."""
    parser.add_argument(
        "--baseline-src",
        type=candor_source,
        default=None,
        help=f"a candor `src` directory (e.g. an export of an older commit): {what}, for "
        "before/after figures in one run",
    )


def target_lines(summary: dict[str, Any]) -> list[str]:
    """Console lines: each target with its verdict, then what was skipped and why."""
    lines = [
        f"  target: {v['target']}: {v['value']} -> {'meets' if v['met'] else 'MISSES'}" for v in summary["verdicts"]
    ]
    lines += [f"  {name}: SKIPPED ({reason})" for name, reason in summary["skipped"].items()]
    return lines


def missed_lines(summary: dict[str, Any], *, why: str = "") -> list[str]:
    """Reading lines: each missed target (with `why`, a pointer to the explanation) and each unmeasured part."""
    lines = [f"Missed: {v['target']} (measured {v['value']}){why}." for v in summary["verdicts"] if not v["met"]]
    lines += [
        f"{name}: not measured ({reason}); no figure is given for it." for name, reason in summary["skipped"].items()
    ]
    return lines


def emit(summary: dict[str, Any], report: Callable[[dict[str, Any]], str], json_path: Path | None) -> int:
    """Print the human report and write the JSON summary; the script's exit code."""
    print(report(summary), flush=True)
    if json_path is not None:
        json_path.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return 0


def progress_bar(console: Console) -> Progress:
    """The service benchmarks' progress bar: description, bar, done/total, elapsed time."""
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    return Progress(*columns, TimeElapsedColumn(), console=console)
