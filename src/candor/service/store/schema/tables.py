"""The service schema (spec §5.1, §6): every table, index, constraint and trigger, one schema for both dialects.

* Timestamps are `DOUBLE` epoch seconds written from the database clock (`dialect.db_now()`), so lease and due-time
  comparisons are plain number comparisons everywhere. JSON columns are `JSON`/`JSONB`, except checkpoint bodies
  and envelopes: canonical JSON `TEXT`, so their digests cover the stored bytes (§6).
* Identifiers are `String(64)` (`<prefix>_<32 hex>`); stream entries and usage records use integers.
* Foreign keys point from owned rows to their owners only, so back-pointers carry none and there are no cycles; the
  rows a step commit inserts reference their workspace by a foreign key on SQLite only (`_step_workspace`).
* Triggers (S-6…S-9, S-40) are declared as data (`StatusGuard`, `LeaseGuard`, `InsertOnly`), rendered per dialect
  by dialect.py; violations surface as `sqlalchemy.exc.IntegrityError`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from ...protocol import transitions
from .dialect import (
    ID_INTEGER,
    JSON_TYPE,
    STRICTLY_INCREASING_IDS,
    TIMESTAMP,
    InsertOnly,
    LeaseGuard,
    StatusGuard,
    attach_guards,
    partial_index,
)

__all__ = (
    "metadata",
    "workspaces",
    "principals",
    "threads",
    "inbox_entries",
    "runs",
    "run_attempts",
    "checkpoints",
    "checkpoint_messages",
    "usage_records",
    "stream_entries",
    "outbox",
    "subscriptions",
    "RUN_GUARD",
    "ATTEMPT_GUARD",
    "LEASE_GUARD",
    "GUARDS",
    "SEALED_RUN_STATUSES",
    "LIVE_RUN_STATUSES",
    "LIVE_ATTEMPT_STATUSES",
    "FINISHED_ATTEMPT_STATUSES",
    "CHECKPOINT_FORMAT",
)

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

ID = String(64)
NAME = String(200)
CODE = String(32)
DIGEST = String(64)
KEY = String(512)

# The status lists and the status guards are read from protocol/transitions.py, the one source of §5.2 and §5.3.
RUN_STATUSES = transitions.RUN_STATUSES
LIVE_RUN_STATUSES = transitions.live_statuses(transitions.RUN_TRANSITIONS)
SEALED_RUN_STATUSES = transitions.final_statuses(transitions.RUN_TRANSITIONS)
ATTEMPT_STATUSES = transitions.ATTEMPT_STATUSES
LIVE_ATTEMPT_STATUSES = transitions.live_statuses(transitions.ATTEMPT_TRANSITIONS)
FINISHED_ATTEMPT_STATUSES = transitions.final_statuses(transitions.ATTEMPT_TRANSITIONS)
CHECKPOINT_FORMAT = 1


Status = TypeVar("Status", bound=str)


def status_guard(table: str, moves_of: Mapping[Status | None, Collection[Status]], *, rules: str) -> StatusGuard:
    """The triggers enforcing a protocol transition table on the `status` column of `table`."""
    final: tuple[Status, ...] = transitions.final_statuses(moves_of)
    moves: tuple[tuple[Status, Status], ...] = transitions.moves(moves_of)
    return StatusGuard(table=table, initial=transitions.initial_status(moves_of), final=final, moves=moves, rules=rules)


RUN_GUARD = status_guard("runs", transitions.RUN_TRANSITIONS, rules="S-6, S-7")
ATTEMPT_GUARD = status_guard("run_attempts", transitions.ATTEMPT_TRANSITIONS, rules="S-8")
LEASE_GUARD = LeaseGuard(table="run_attempts", column="lease_expires_at", rules="S-9")
GUARDS = (
    RUN_GUARD,
    ATTEMPT_GUARD,
    LEASE_GUARD,
    InsertOnly(table="checkpoint_messages", rules="S-40"),
    InsertOnly(table="usage_records", rules="S-40"),
)


def _in(column: str, values: tuple[str, ...], *, nullable: bool = False) -> str:
    listed = ", ".join(f"'{value}'" for value in values)
    return f"{column} IS NULL OR {column} IN ({listed})" if nullable else f"{column} IN ({listed})"


def _workspace(*, index: bool = True) -> Column[str]:
    """The owning workspace; `index=False` where a composite index leads with it instead."""
    return Column("workspace_id", ID, ForeignKey("workspaces.id"), nullable=False, index=index)


def _sqlite_only(*constraints: ForeignKeyConstraint | CheckConstraint) -> tuple[Any, ...]:
    """Constraints of `checkpoints` kept on SQLite only (migration 0007): on PostgreSQL a plain step is one
    fenced INSERT, and each foreign-key check there locked the referenced thread or run row at every step. The
    fence reads both rows in the same statement, and `step_commit.StepCommit` checks the values the CHECKs did."""
    return tuple(constraint.ddl_if(dialect="sqlite") for constraint in _limited(constraints))


def _limited(constraints: tuple[ForeignKeyConstraint | CheckConstraint, ...]) -> tuple[Any, ...]:
    for constraint in constraints:
        constraint.info["dialects"] = ("sqlite",)
    return constraints


def _step_workspace() -> tuple[Column[str], ForeignKeyConstraint]:
    """The owning workspace of a row that step commits insert, with its foreign key declared for SQLite only.

    On PostgreSQL a foreign-key check locks the referenced row (`FOR KEY SHARE`). With this key every step commit
    of every run in a workspace locked that workspace's one row, and commits running at the same time share such a
    lock only through a MultiXact, spending MultiXact ids and member space that `VACUUM` must later freeze and
    server CPU on every commit (docs/worker-cost.md). The workspace exists all the same: the row's thread or run
    references it by a foreign key of its own, and the step commit locks that thread or run row anyway. On SQLite,
    one writer and no row locks, the check is an index lookup and stays. `info["dialects"]` lets the schema comparison
    (`migrate.include_object_for`) skip the key where `ddl_if` keeps it out of `CREATE TABLE`.
    """
    key = ForeignKeyConstraint(["workspace_id"], ["workspaces.id"], info={"dialects": ("sqlite",)})
    return Column("workspace_id", ID, nullable=False, index=True), key.ddl_if(dialect="sqlite")


workspaces = Table(
    "workspaces",
    metadata,
    Column("id", ID, primary_key=True),
    Column("name", NAME, nullable=False, unique=True),
    Column("archived_at", TIMESTAMP),
    Column("created_at", TIMESTAMP, nullable=False),
)

principals = Table(
    "principals",
    metadata,
    Column("id", ID, primary_key=True),
    _workspace(),
    Column("name", NAME, nullable=False),
    Column("secret_hash", DIGEST, nullable=False, unique=True),
    Column("permissions", JSON_TYPE, nullable=False),
    Column("disabled_at", TIMESTAMP),
    Column("version", Integer, nullable=False, default=1),
    Column("created_at", TIMESTAMP, nullable=False),
)

threads = Table(
    "threads",
    metadata,
    Column("id", ID, primary_key=True),
    _workspace(),
    Column("origin", CODE, nullable=False),
    Column("origin_thread_id", ID),
    Column("origin_run_id", ID, index=True),
    Column("origin_tool_call_id", String(256)),
    Column("agent", NAME, nullable=False),
    Column("base_checkpoint_id", ID),
    Column("current_run_id", ID),
    Column("last_run_id", ID),
    Column("archived_at", TIMESTAMP),
    Column("version", Integer, nullable=False, default=1),
    Column("created_at", TIMESTAMP, nullable=False),
    Column("updated_at", TIMESTAMP, nullable=False),
    CheckConstraint(_in("origin", ("new", "fork", "child")), name="origin"),
    # Checkpoint cleanup asks which threads are based on a page's checkpoints (§9.6, store/outbox/cleanup.py); few are.
    partial_index("ix_threads_base_checkpoint_id", "base_checkpoint_id", where="base_checkpoint_id IS NOT NULL"),
    # GET /v1/threads pages a workspace's threads newest first (store/reads/thread_lists.py, the console's inspector).
    Index("ix_threads_workspace_created", "workspace_id", "created_at", "id"),
)

inbox_entries = Table(
    "inbox_entries",
    metadata,
    Column("id", ID, primary_key=True),
    _workspace(),
    Column("thread_id", ID, ForeignKey("threads.id"), nullable=False),
    Column("kind", CODE, nullable=False),
    Column("delivery", CODE, nullable=False),
    Column("position", Integer, nullable=False),
    Column("principal_id", ID),
    Column("authority", JSON_TYPE),
    Column("payload", JSON_TYPE, nullable=False),
    Column("size", Integer, nullable=False),
    Column("agent", NAME),
    Column("options", JSON_TYPE),
    Column("options_digest", DIGEST),
    Column("child_run_id", ID, unique=True),
    Column("request_key", KEY),
    Column("request_digest", DIGEST),
    Column("request_kind", CODE),
    Column("status", CODE, nullable=False),
    Column("assigned_run_id", ID, index=True),
    Column("incorporated_checkpoint_seq", Integer),
    Column("failure", JSON_TYPE),
    Column("created_at", TIMESTAMP, nullable=False),
    Column("finished_at", TIMESTAMP),
    UniqueConstraint("thread_id", "position"),
    UniqueConstraint("principal_id", "request_key"),
    Index(None, "thread_id", "status"),
    CheckConstraint("position > 0", name="position"),
    CheckConstraint(_in("kind", ("message", "child_result")), name="kind"),
    CheckConstraint(_in("delivery", ("steer", "next_run")), name="delivery"),
    CheckConstraint(_in("request_kind", ("thread", "message", "fork"), nullable=True), name="request_kind"),
    CheckConstraint(_in("status", transitions.ENTRY_STATUSES), name="status"),
    # S-76: consumed exactly when incorporated_checkpoint_seq is set.
    CheckConstraint("(status = 'consumed') = (incorporated_checkpoint_seq IS NOT NULL)", name="consumed_seq"),
)

runs = Table(
    "runs",
    metadata,
    Column("id", ID, primary_key=True),
    _workspace(index=False),
    Column("thread_id", ID, ForeignKey("threads.id"), nullable=False),
    Column("agent", NAME, nullable=False),
    Column("principal_id", ID, nullable=False),
    Column("authority", JSON_TYPE, nullable=False),
    Column("options", JSON_TYPE, nullable=False),
    Column("options_digest", DIGEST, nullable=False),
    Column("source_entry_id", ID),
    Column("resume", JSON_TYPE),
    Column("resumed_by_id", ID),
    Column("request_key", KEY),
    Column("request_digest", DIGEST),
    Column("trigger", CODE, nullable=False),
    Column("lineage", CODE, nullable=False),
    Column("parent_run_id", ID, index=True),
    Column("status", CODE, nullable=False),
    Column("wait_reason", CODE),
    Column("pending", JSON_TYPE),
    Column("cancel_requested_at", TIMESTAMP),
    Column("current_attempt_id", ID),
    Column("available_at", TIMESTAMP, nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("max_attempts", Integer, nullable=False),
    Column("tool_recovery", CODE, nullable=False, server_default="declared"),
    # The W3C `traceparent` of the request (or attempt) that created the run; its attempts trace under it.
    Column("trace_context", String(128)),
    Column("start_checkpoint_id", ID),
    Column("checkpoint_id", ID),
    Column("checkpoint_seq", Integer, nullable=False, default=0),
    Column("output", JSON_TYPE),
    Column("failure", JSON_TYPE),
    Column("usage", JSON_TYPE),
    Column("created_at", TIMESTAMP, nullable=False),
    Column("started_at", TIMESTAMP),
    Column("sealed_at", TIMESTAMP),
    Column("version", Integer, nullable=False, default=1),
    # S-1: at most one accepted or running run per thread.
    partial_index("uq_runs_live_thread", "thread_id", where=_in("status", LIVE_RUN_STATUSES), unique=True),
    partial_index("ix_runs_due", "available_at", "id", where="status = 'accepted'"),
    # GET /v1/runs pages a workspace's runs newest first (store/reads/run_lists.py): the keyset walks this index instead
    # of sorting the workspace's runs, and the approvals console's waiting runs have a small index of their own.
    Index("ix_runs_workspace_created", "workspace_id", "created_at", "id"),
    partial_index("ix_runs_workspace_waiting", "workspace_id", "created_at", "id", where="status = 'waiting'"),
    UniqueConstraint("resumed_by_id", "request_key", name="uq_runs_resume_request"),
    Index(None, "thread_id", "created_at"),
    # Checkpoint cleanup asks which runs start from a page's checkpoints (§9.6). Set once at insert, so a step
    # commit's update of the run never touches it.
    Index(None, "start_checkpoint_id"),
    CheckConstraint("attempts >= 0 AND attempts <= max_attempts", name="attempts"),
    CheckConstraint(_in("status", RUN_STATUSES), name="status"),
    CheckConstraint(_in("trigger", ("input", "queued", "resume", "child_result", "spawned")), name="trigger"),
    CheckConstraint(_in("lineage", ("root", "continue", "fork")), name="lineage"),
    CheckConstraint(_in("wait_reason", ("approval", "call", "multiple"), nullable=True), name="wait_reason"),
    CheckConstraint("checkpoint_seq >= 0", name="checkpoint_seq"),
    # S-3: current_attempt_id exactly while running. S-4: sealed_at, failure, pending/wait_reason by status.
    CheckConstraint("(status = 'running') = (current_attempt_id IS NOT NULL)", name="current_attempt"),
    CheckConstraint(f"({_in('status', SEALED_RUN_STATUSES)}) = (sealed_at IS NOT NULL)", name="sealed_at"),
    CheckConstraint(f"({_in('status', ('failed', 'cancelled'))}) = (failure IS NOT NULL)", name="failure"),
    CheckConstraint("(status = 'waiting') = (pending IS NOT NULL AND wait_reason IS NOT NULL)", name="pending"),
    # S-5: a waiting or completed run always has a checkpoint.
    CheckConstraint("status NOT IN ('waiting', 'completed') OR checkpoint_seq >= 1", name="sealed_checkpoint"),
)
attach_guards(runs, [RUN_GUARD])

run_attempts = Table(
    "run_attempts",
    metadata,
    Column("id", ID, primary_key=True),
    _workspace(),
    Column("run_id", ID, ForeignKey("runs.id"), nullable=False),
    Column("number", Integer, nullable=False),
    Column("status", CODE, nullable=False),
    Column("start_reason", CODE, nullable=False),
    Column("replaces_attempt_id", ID),
    Column("worker_id", NAME, nullable=False),
    Column("worker_build", NAME),
    Column("harness_run_id", ID),
    Column("lease_token_hash", DIGEST, nullable=False),
    Column("lease_expires_at", TIMESTAMP, nullable=False),
    Column("heartbeat_at", TIMESTAMP, nullable=False),
    Column("yield_reason", CODE),
    Column("failure", JSON_TYPE),
    Column("created_at", TIMESTAMP, nullable=False),
    Column("started_at", TIMESTAMP),
    Column("finished_at", TIMESTAMP),
    Column("updated_at", TIMESTAMP, nullable=False),
    UniqueConstraint("run_id", "number"),
    # S-2: at most one leased or running attempt per run.
    partial_index("uq_run_attempts_live_run", "run_id", where=_in("status", LIVE_ATTEMPT_STATUSES), unique=True),
    partial_index("ix_run_attempts_live_lease", "lease_expires_at", "id", where=_in("status", LIVE_ATTEMPT_STATUSES)),
    CheckConstraint("number >= 1", name="number"),
    CheckConstraint(_in("status", ATTEMPT_STATUSES), name="status"),
    CheckConstraint(_in("start_reason", ("initial", "recovery", "handoff")), name="start_reason"),
    CheckConstraint(_in("yield_reason", ("handoff",), nullable=True), name="yield_reason"),
)
attach_guards(run_attempts, [ATTEMPT_GUARD, LEASE_GUARD])

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("id", ID, primary_key=True),
    *_step_workspace(),
    Column("thread_id", ID, nullable=False, index=True),
    Column("run_id", ID),
    Column("seq", Integer, nullable=False),
    Column("attempt", Integer),
    Column("format", Integer, nullable=False),
    Column("base_id", ID, index=True),  # checkpoint cleanup reads a page's checkpoints' children (§9.6)
    Column("kept", Integer, nullable=False),
    Column("count", Integer, nullable=False),
    Column("envelope", Text),
    Column("envelope_digest", DIGEST, nullable=False),
    # §6 amended: the new messages packed into the row (store/checkpoints/packed_messages.py); NULL on rows written
    # before migration 0007, whose messages are `checkpoint_messages` rows.
    Column("messages", Text),
    # The usage the commit's boundary incurred (a delta, like a `usage_records` row); summed at seal (§7.8).
    Column("usage", JSON_TYPE),
    Column("created_at", TIMESTAMP, nullable=False),
    UniqueConstraint("run_id", "seq"),
    *_sqlite_only(
        ForeignKeyConstraint(["thread_id"], ["threads.id"]),
        ForeignKeyConstraint(["run_id"], ["runs.id"]),
        CheckConstraint("kept >= 0 AND kept <= count", name="kept"),
        CheckConstraint("format >= 1", name="format"),
        # §6: seq 0 without a run is a thread's imported history; run commits have seq >= 1 and an attempt number.
        CheckConstraint(
            "(run_id IS NULL AND seq = 0 AND attempt IS NULL) OR (run_id IS NOT NULL AND seq >= 1 AND attempt >= 1)",
            name="seq",
        ),
    ),
)

checkpoint_messages = Table(
    "checkpoint_messages",
    metadata,
    Column("checkpoint_id", ID, ForeignKey("checkpoints.id"), nullable=False),
    Column("index", Integer, nullable=False),
    Column("body", Text, nullable=False),
    Column("digest", DIGEST, nullable=False),
    PrimaryKeyConstraint("checkpoint_id", "index"),
    CheckConstraint('"index" >= 0', name="index"),
)
attach_guards(checkpoint_messages, [GUARDS[3]])

usage_records = Table(
    "usage_records",
    metadata,
    Column("id", ID_INTEGER, primary_key=True, autoincrement=True),
    *_step_workspace(),
    Column("run_id", ID, ForeignKey("runs.id"), nullable=False, index=True),
    Column("attempt_id", ID),
    Column("checkpoint_seq", Integer),
    Column("usage", JSON_TYPE, nullable=False),
    Column("created_at", TIMESTAMP, nullable=False),
)
attach_guards(usage_records, [GUARDS[4]])

stream_entries = Table(
    "stream_entries",
    metadata,
    Column("id", ID_INTEGER, primary_key=True, autoincrement=True),
    *_step_workspace(),
    Column("thread_id", ID, ForeignKey("threads.id"), nullable=False),
    Column("run_id", ID, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("sequence", Integer, nullable=False),
    Column("type", CODE, nullable=False),
    Column("payload", JSON_TYPE, nullable=False),
    Column("created_at", TIMESTAMP, nullable=False),
    Index(None, "thread_id", "id"),
    Index(None, "created_at"),
    CheckConstraint(_in("type", ("delta", "boundary")), name="type"),
    **STRICTLY_INCREASING_IDS,
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", ID, primary_key=True),
    _workspace(),
    Column("kind", CODE, nullable=False),
    Column("dedupe_key", KEY, nullable=False),
    Column("target", Text),
    Column("payload", JSON_TYPE, nullable=False),
    Column("signing_secret", Text),
    # signing_secret: the subscription's encrypted secret copied when staged (§9.4); null for other kinds.
    Column("subscription_id", ID, index=True),
    Column("status", CODE, nullable=False),
    Column("available_at", TIMESTAMP, nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("lease_owner", NAME),
    Column("lease_token_hash", DIGEST),
    Column("lease_expires_at", TIMESTAMP),
    Column("last_error", String(1024)),
    Column("created_at", TIMESTAMP, nullable=False),
    Column("delivered_at", TIMESTAMP),
    Column("settled_at", TIMESTAMP),
    UniqueConstraint("kind", "dedupe_key"),
    partial_index("ix_outbox_due", "kind", "available_at", "id", where="status = 'pending'"),
    partial_index("ix_outbox_settled", "kind", "status", "settled_at", where="status <> 'pending'"),
    CheckConstraint(_in("kind", ("webhook", "child_result", "checkpoint_cleanup")), name="kind"),
    CheckConstraint(_in("status", transitions.OUTBOX_STATUSES), name="status"),
    CheckConstraint("attempts >= 0", name="attempts"),
    CheckConstraint("last_error IS NULL OR length(last_error) <= 1024", name="last_error"),
)

subscriptions = Table(
    "subscriptions",
    metadata,
    Column("id", ID, primary_key=True),
    _workspace(),
    Column("name", NAME, nullable=False),
    Column("url", Text, nullable=False),
    Column("events", JSON_TYPE, nullable=False),
    Column("filter", JSON_TYPE, nullable=False),
    Column("enabled", Boolean, nullable=False, default=True),
    Column("signing_secret", Text, nullable=False),
    Column("version", Integer, nullable=False, default=1),
    Column("created_by_id", ID, nullable=False),
    Column("updated_by_id", ID, nullable=False),
    Column("created_at", TIMESTAMP, nullable=False),
    Column("updated_at", TIMESTAMP, nullable=False),
    # Names are unique per workspace, so a duplicate never reveals another tenant's subscription (S-126).
    UniqueConstraint("workspace_id", "name"),
)
