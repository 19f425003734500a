"""Suite-wide pytest configuration: the files holding `slow` tests run first.

`make test` runs the suite on several processes (pytest-xdist, `--dist loadfile`: a worker is handed the next test
file as it finishes the ones it holds, and runs a file's tests one after the other, so the service benchmarks' smoke
runs in tests/test_bench_smoke.py never run two at a time). Starting the long files first spreads them over the
workers while the short ones fill the gaps; started last, one of them would be the suite's tail.
"""

from __future__ import annotations

from collections import Counter

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Stable: files with more `slow` tests first, the others in collection order, each file's tests in their order
    (every xdist worker computes the same order)."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.path])
