"""Every statement builder of store/runs/claims.py and store/attempts/seals.py compiles for both dialects (STYLE habit 4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from candor.service.protocol.transitions import AttemptEnd
from candor.service.store.attempts import inputs as run_inputs
from candor.service.store.attempts import recovery as recovery
from candor.service.store.attempts import seals as seals
from candor.service.store.runs import claims as runs
from candor.service.store.runs import leases as leases

DIALECTS = {"sqlite": sqlite.dialect(), "postgresql": postgresql.dialect()}

BUILDERS: dict[str, Callable[[], Any]] = {
    "runs.select_now": runs.select_now,
    "runs.select_claimable": lambda: runs.select_claimable(agents=["a"], limit=2, now=1.0),
    "runs.select_previous_attempt": lambda: runs.select_previous_attempt("run_x"),
    "runs.insert_attempt": lambda: runs.insert_attempt(
        attempt_id="att_x",
        workspace_id="wsp_x",
        run_id="run_x",
        number=1,
        start_reason="initial",
        replaces_attempt_id=None,
        worker_id="w",
        token_hash="0" * 64,
        now=1.0,
        lease_seconds=30,
    ),
    "runs.update_run_claimed": lambda: runs.update_run_claimed(
        run_id="run_x", attempt_id="att_x", attempts=1, first_claim=True, now=1.0
    ),
    "runs.lock_thread": lambda: runs.lock_thread("thr_x", skip_locked=True),
    "runs.lock_run": lambda: runs.lock_run("run_x"),
    "runs.lock_attempt": lambda: runs.lock_attempt("att_x"),
    "runs.lock_fenced_rows": runs.lock_fenced_rows,
    "runs.update_attempt_started": lambda: runs.update_attempt_started(attempt_id="att_x", harness_run_id="r", now=1.0),
    "leases.select_renewable": lambda: leases.select_renewable(
        attempt_ids=["att_x"], worker_id="w", now=1.0, lease_seconds=30
    ),
    "leases.update_leases": lambda: leases.update_leases(attempt_ids=["att_x"], now=1.0, lease_seconds=30),
    "leases.select_supervision": lambda: leases.select_supervision(["run_x"]),
    "seals.insert_usage_record": lambda: seals.insert_usage_record(
        run_id="run_x", attempt_id="att_x", checkpoint_seq=1, usage={}
    ),
    "seals.update_checkpoint_pointer": seals.update_checkpoint_pointer,
    "seals.consume_entries": lambda: seals.consume_entries(run_id="run_x", entry_ids=["ent_x"], seq=1, now=1.0),
    "seals.select_steer_candidates": lambda: seals.select_steer_candidates("thr_x"),
    "seals.assign_entries": lambda: seals.assign_entries(run_id="run_x", entry_ids=["ent_x"]),
    "seals.select_entry_payloads": lambda: seals.select_entry_payloads(["ent_x"]),
    "seals.finish_attempt": lambda: seals.finish_attempt(
        attempt_id="att_x", end=AttemptEnd(status="failed"), attempt_failure={"code": "x", "message": "y"}, now=1.0
    ),
    "seals.seal_run_row": lambda: seals.seal_run_row(
        run_id="run_x", request=seals.SealRequest(status="completed", output="o"), usage={}, now=1.0
    ),
    "seals.update_thread_sealed": lambda: seals.update_thread_sealed(thread_id="thr_x", run_id="run_x", now=1.0),
    "seals.release_entries": lambda: seals.release_entries(run_id="run_x", status="failed", now=1.0),
    "seals.bump_thread_version": lambda: seals.bump_thread_version(thread_id="thr_x", now=1.0),
    "recovery.requeue_run": lambda: recovery.requeue_run(run_id="run_x", available_at=1.0),
    "seals.select_run_usage": lambda: seals.select_run_usage("run_x"),
    "recovery.select_expired_attempts": lambda: recovery.select_expired_attempts(after=(1.0, "att_x"), limit=10),
    "run_inputs.select_entry": lambda: run_inputs.select_entry("ent_x"),
    "run_inputs.select_assigned_entries": lambda: run_inputs.select_assigned_entries("run_x"),
    "run_inputs.select_run_checkpoint": lambda: run_inputs.select_run_checkpoint("run_x"),
}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_builders_compile(builder: str, dialect: str) -> None:
    assert str(BUILDERS[builder]().compile(dialect=DIALECTS[dialect])).strip()


def test_claims_skip_locked_rows_on_postgresql_only() -> None:
    """§2.2, S-11: `FOR … SKIP LOCKED` on PostgreSQL; SQLite has no row locks (BEGIN IMMEDIATE serializes)."""
    claim = runs.select_claimable(agents=["a"], limit=2, now=1.0)
    assert "FOR NO KEY UPDATE OF runs SKIP LOCKED" in str(claim.compile(dialect=DIALECTS["postgresql"]))
    assert "FOR " not in str(claim.compile(dialect=DIALECTS["sqlite"]))
