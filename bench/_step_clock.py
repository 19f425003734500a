"""Step latency as the scripted model sees it: the time between a run's consecutive model requests.

Not a benchmark itself (private module, skipped by `bench.run_all`). Standard library only: the peers' step server
(bench/peers/step_server.py, in the peers venv) and candor's worker processes (bench/_agents.py) both import it.

A step of the scripted loop is one model response (a `step` tool call), the tool's result and whatever the system
persists around them; it ends when the next model request starts. The interval between two consecutive model
requests of one run is therefore the step's latency, measured the same way inside every system, whatever its
design. Less the model's own think time (`model_seconds`), it is what the system adds to a step: persistence,
scheduling, waiting for the CPU or a connection. The time before a run's first model request (acceptance, queueing,
claim) is not a step and is left out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from itertools import pairwise

__all__ = ("StepClock", "step_intervals", "added_latency_ms")


def step_intervals(request_times: Sequence[float]) -> list[float]:
    """Seconds between consecutive model requests of one run (its step latencies), oldest first."""
    return [later - earlier for earlier, later in pairwise(request_times)]


def added_latency_ms(intervals: Iterable[float], model_seconds: float) -> list[float]:
    """Each step's latency less the model's think time, in ms: what the system added to the step."""
    return [(interval - model_seconds) * 1000 for interval in intervals]


class StepClock:
    """Model request times per run, turned into step intervals when the run's final request is made.

    Thread-safe: a LangGraph run calls it from its own thread. A run is named by `run_key` (its unique prompt);
    runs that never reach their final request leave no intervals."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[str, list[float]] = {}
        self._intervals: list[float] = []

    def model_requested(self, run_key: str, *, final: bool) -> None:
        """A model request of run `run_key` starts now; `final`: the model answers this one (the run's last)."""
        now = time.monotonic()
        with self._lock:
            times = self._requests.setdefault(run_key, [])
            times.append(now)
            if final:
                self._intervals.extend(step_intervals(self._requests.pop(run_key)))

    def take(self) -> list[float]:
        """The intervals of every run finished since the last `take()`, in seconds."""
        with self._lock:
            taken, self._intervals = self._intervals, []
        return taken
