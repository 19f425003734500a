"""Suite-wide pytest configuration: each test marked by its level, the files holding `slow` tests run first.

The suite is split by what a test needs (CONTRIBUTING.md): tests/unit (no database, no child process, no network
server), tests/integration (a database, or an in-process app or server over one), tests/e2e (real processes). Every
test gets the marker of its level, so `pytest -m unit` runs the tests that need nothing but Python. Helpers shared
between levels live in tests/support, which `[tool.pytest.ini_options] pythonpath` puts on `sys.path`; the database
fixtures (`db`, `empty_db`, `postgres_url`, ...) are its `database_fixtures` plugin.

`make test` runs the suite on several processes (pytest-xdist, `--dist loadfile`: a worker is handed the next test
file as it finishes the ones it holds, and runs a file's tests one after the other, so the service benchmarks' smoke
runs in tests/e2e/bench/test_bench_smoke.py never run two at a time). Starting the long files first spreads them over
the workers while the short ones fill the gaps; started last, one of them would be the suite's tail.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytest_plugins = ["database_fixtures"]

TESTS = Path(__file__).resolve().parent
LEVELS = ("unit", "integration", "e2e")


def level_of(path: Path) -> str | None:
    """The level directory (`unit`, `integration`, `e2e`) a test file is under, if any."""
    parts = path.resolve().relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 and parts[0] in LEVELS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by its level; then, stable: files with more `slow` tests first, the others in collection
    order, each file's tests in their order (every xdist worker computes the same order)."""
    for item in items:
        level = level_of(item.path)
        if level is not None:
            item.add_marker(level)
    slow = Counter(item.path for item in items if item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.path])
