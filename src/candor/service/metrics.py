"""Every Prometheus metric of spec §10.4, declared once on the default registry; code elsewhere imports them.

Names and labels are stable: the shipped alert rules (`docs/alerts.yml`) are written against them.
"""

from __future__ import annotations

from typing import cast, get_args

from prometheus_client import Counter, Gauge, Histogram

from .protocol.transitions import AttemptEnding, attempt_end

__all__ = (
    "RUNS_ACCEPTED",
    "RUNS_SEALED",
    "ATTEMPT_QUEUE_WAIT",
    "ATTEMPT_DURATION",
    "WORKER_SLOTS",
    "CHECKPOINT_COMMIT_BYTES",
    "OUTBOX_DELIVERIES",
    "BACKLOG_SIZE",
    "BACKLOG_OLDEST_AGE",
    "OUTBOX_BACKLOG_ALERT",
    "OUTBOX_DEAD",
    "SWEEP_PASSES",
    "HTTP_REQUEST_DURATION",
    "SQLITE_WRITER_WAIT",
    "DB_CONNECTIONS",
    "DB_CONNECTION_LIMIT",
    "METRIC_NAMES",
    "attempt_status_label",
)

RUNS_ACCEPTED = Counter("candor_runs_accepted_total", "Runs created, by trigger.", ["trigger"])
RUNS_SEALED = Counter("candor_runs_sealed_total", "Runs sealed, by status and reason.", ["status", "reason"])
ATTEMPT_QUEUE_WAIT = Histogram("candor_attempt_queue_wait_seconds", "Time from due to claim.")
ATTEMPT_DURATION = Histogram(
    "candor_attempt_duration_seconds",
    "Attempt duration, by final status (succeeded, failed, cancelled, yielded; abandoned when left to lease expiry).",
    ["status"],
)
WORKER_SLOTS = Gauge("candor_worker_slots", "Worker slots, by state (free, busy).", ["state"])
CHECKPOINT_COMMIT_BYTES = Histogram(
    "candor_checkpoint_commit_bytes",
    "Bytes written per checkpoint commit (message rows + envelope), by boundary.",
    ["boundary"],
    buckets=(256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304),
)
OUTBOX_DELIVERIES = Counter(
    "candor_outbox_deliveries_total", "Outbox handler results, by kind and result.", ["kind", "result"]
)
BACKLOG_SIZE = Gauge(
    "candor_backlog_size", "Due items per queue (runs and each outbox kind), capped at 10000.", ["queue"]
)
BACKLOG_OLDEST_AGE = Gauge("candor_backlog_oldest_age_seconds", "Age of the oldest due item per queue.", ["queue"])
OUTBOX_BACKLOG_ALERT = Gauge(
    "candor_outbox_backlog_alert", "1 when an outbox kind's backlog breach has lasted backlog_alert_seconds.", ["kind"]
)
OUTBOX_DEAD = Gauge("candor_outbox_dead", "1 while any dead row of the kind is retained.", ["kind"])
SWEEP_PASSES = Counter("candor_sweep_passes_total", "Control sweep passes, by sweep and result.", ["sweep", "result"])
HTTP_REQUEST_DURATION = Histogram(
    "candor_http_request_duration_seconds", "HTTP request duration.", ["method", "route", "status"]
)
SQLITE_WRITER_WAIT = Histogram(
    "candor_sqlite_writer_wait_seconds",
    "Time a SQLite write transaction waited for its turn among the process's writers (store/db/writer_gate.py).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
DB_CONNECTIONS = Gauge(
    "candor_db_connections",
    "PostgreSQL connections of this process, by role (pool, heartbeat, listen) and state (in_use, idle).",
    ["role", "state"],
)
DB_CONNECTION_LIMIT = Gauge(
    "candor_db_connection_limit",
    "Most PostgreSQL connections this process may hold, by role (pool: pool_size + max_overflow; heartbeat; listen).",
    ["role"],
)

METRIC_NAMES: frozenset[str] = frozenset(
    {
        "candor_runs_accepted_total",
        "candor_runs_sealed_total",
        "candor_attempt_queue_wait_seconds",
        "candor_attempt_duration_seconds",
        "candor_worker_slots",
        "candor_checkpoint_commit_bytes",
        "candor_outbox_deliveries_total",
        "candor_backlog_size",
        "candor_backlog_oldest_age_seconds",
        "candor_outbox_backlog_alert",
        "candor_outbox_dead",
        "candor_sweep_passes_total",
        "candor_http_request_duration_seconds",
        "candor_sqlite_writer_wait_seconds",
        "candor_db_connections",
        "candor_db_connection_limit",
    }
)
"""The §10.4 names as exposed (histograms add `_bucket`, `_sum`, `_count`), and candor's own
`candor_sqlite_writer_wait_seconds`, `candor_db_connections` and `candor_db_connection_limit` (docs/operations.md)."""


_SEAL_ENDINGS: frozenset[str] = frozenset(get_args(AttemptEnding))


def attempt_status_label(ended: str) -> str:
    """The `status` label of `candor_attempt_duration_seconds` for how the worker saw its attempt end: the §5.3
    attempt status for a seal (`completed`/`waiting` → `succeeded`, …); the attempt statuses of a recovery
    (`failed`, `yielded`) and the worker's own `abandoned` (lease lost, deadline) / `crashed` pass through."""
    if ended in _SEAL_ENDINGS:
        return attempt_end(cast(AttemptEnding, ended)).status
    return ended
