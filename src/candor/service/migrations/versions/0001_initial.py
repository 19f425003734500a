"""Initial schema: every table of spec §5.1 and §6 with its indexes, constraints and triggers (S-6 … S-9, S-40).

Revision ID: 0001
Revises: (none)

Frozen copy of tables.py at this revision; the trigger SQL below is the rendering of tables.GUARDS by
store/dialect.py at this revision. Later schema changes add revisions and never edit this file.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
ID_INTEGER = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

SQLITE_TRIGGERS = (
    "CREATE TRIGGER trg_runs_insert BEFORE INSERT ON runs WHEN NEW.status IS NOT 'accepted' BEGIN SELECT RAISE(ABORT, 'candor: runs: rows must be inserted with status accepted (S-6, S-7)'); END",
    "CREATE TRIGGER trg_runs_final BEFORE UPDATE ON runs WHEN OLD.status IN ('waiting', 'completed', 'failed', 'cancelled') BEGIN SELECT RAISE(ABORT, 'candor: runs: rows in a final status are immutable (S-6, S-7)'); END",
    "CREATE TRIGGER trg_runs_move BEFORE UPDATE OF status ON runs WHEN NEW.status IS NOT OLD.status AND (OLD.status || '>' || NEW.status) NOT IN ('accepted>running', 'accepted>cancelled', 'accepted>failed', 'running>accepted', 'running>completed', 'running>waiting', 'running>failed', 'running>cancelled') BEGIN SELECT RAISE(ABORT, 'candor: runs: status change not allowed (S-6, S-7)'); END",
    "CREATE TRIGGER trg_run_attempts_insert BEFORE INSERT ON run_attempts WHEN NEW.status IS NOT 'leased' BEGIN SELECT RAISE(ABORT, 'candor: run_attempts: rows must be inserted with status leased (S-8)'); END",
    "CREATE TRIGGER trg_run_attempts_final BEFORE UPDATE ON run_attempts WHEN OLD.status IN ('succeeded', 'yielded', 'failed', 'cancelled') BEGIN SELECT RAISE(ABORT, 'candor: run_attempts: rows in a final status are immutable (S-8)'); END",
    "CREATE TRIGGER trg_run_attempts_move BEFORE UPDATE OF status ON run_attempts WHEN NEW.status IS NOT OLD.status AND (OLD.status || '>' || NEW.status) NOT IN ('leased>running', 'leased>succeeded', 'leased>yielded', 'leased>failed', 'leased>cancelled', 'running>succeeded', 'running>yielded', 'running>failed', 'running>cancelled') BEGIN SELECT RAISE(ABORT, 'candor: run_attempts: status change not allowed (S-8)'); END",
    "CREATE TRIGGER trg_run_attempts_lease_expires_at BEFORE UPDATE OF lease_expires_at ON run_attempts WHEN NEW.lease_expires_at > OLD.lease_expires_at AND OLD.lease_expires_at <= ((julianday('now') - 2440587.5) * 86400.0) BEGIN SELECT RAISE(ABORT, 'candor: run_attempts: an expired lease cannot be extended (S-9)'); END",
    "CREATE TRIGGER trg_checkpoint_messages_insert_only BEFORE UPDATE ON checkpoint_messages WHEN 1 BEGIN SELECT RAISE(ABORT, 'candor: checkpoint_messages: rows are insert-only (S-40)'); END",
    "CREATE TRIGGER trg_usage_records_insert_only BEFORE UPDATE ON usage_records WHEN 1 BEGIN SELECT RAISE(ABORT, 'candor: usage_records: rows are insert-only (S-40)'); END",
)

POSTGRESQL_TRIGGERS = (
    """CREATE FUNCTION candor_runs_status_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
IF TG_OP = 'INSERT' THEN
  IF NEW.status IS DISTINCT FROM 'accepted' THEN RAISE EXCEPTION 'candor: runs: rows must be inserted with status accepted (S-6, S-7)' USING ERRCODE = 'check_violation'; END IF;
  RETURN NEW;
END IF;
IF OLD.status IN ('waiting', 'completed', 'failed', 'cancelled') THEN RAISE EXCEPTION 'candor: runs: rows in a final status are immutable (S-6, S-7)' USING ERRCODE = 'check_violation'; END IF;
IF NEW.status IS DISTINCT FROM OLD.status
   AND (OLD.status || '>' || NEW.status) NOT IN ('accepted>running', 'accepted>cancelled', 'accepted>failed', 'running>accepted', 'running>completed', 'running>waiting', 'running>failed', 'running>cancelled') THEN RAISE EXCEPTION 'candor: runs: status change not allowed (S-6, S-7)' USING ERRCODE = 'check_violation'; END IF;
RETURN NEW;
END
$$""",
    'CREATE TRIGGER trg_runs_status BEFORE INSERT OR UPDATE ON runs FOR EACH ROW EXECUTE FUNCTION candor_runs_status_guard()',
    """CREATE FUNCTION candor_run_attempts_status_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
IF TG_OP = 'INSERT' THEN
  IF NEW.status IS DISTINCT FROM 'leased' THEN RAISE EXCEPTION 'candor: run_attempts: rows must be inserted with status leased (S-8)' USING ERRCODE = 'check_violation'; END IF;
  RETURN NEW;
END IF;
IF OLD.status IN ('succeeded', 'yielded', 'failed', 'cancelled') THEN RAISE EXCEPTION 'candor: run_attempts: rows in a final status are immutable (S-8)' USING ERRCODE = 'check_violation'; END IF;
IF NEW.status IS DISTINCT FROM OLD.status
   AND (OLD.status || '>' || NEW.status) NOT IN ('leased>running', 'leased>succeeded', 'leased>yielded', 'leased>failed', 'leased>cancelled', 'running>succeeded', 'running>yielded', 'running>failed', 'running>cancelled') THEN RAISE EXCEPTION 'candor: run_attempts: status change not allowed (S-8)' USING ERRCODE = 'check_violation'; END IF;
RETURN NEW;
END
$$""",
    'CREATE TRIGGER trg_run_attempts_status BEFORE INSERT OR UPDATE ON run_attempts FOR EACH ROW EXECUTE FUNCTION candor_run_attempts_status_guard()',
    """CREATE FUNCTION candor_run_attempts_lease_expires_at_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
IF NEW.lease_expires_at > OLD.lease_expires_at AND OLD.lease_expires_at <= CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION) THEN RAISE EXCEPTION 'candor: run_attempts: an expired lease cannot be extended (S-9)' USING ERRCODE = 'check_violation'; END IF;
RETURN NEW;
END
$$""",
    'CREATE TRIGGER trg_run_attempts_lease_expires_at BEFORE UPDATE OF lease_expires_at ON run_attempts FOR EACH ROW EXECUTE FUNCTION candor_run_attempts_lease_expires_at_guard()',
    """CREATE FUNCTION candor_checkpoint_messages_insert_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
RAISE EXCEPTION 'candor: checkpoint_messages: rows are insert-only (S-40)' USING ERRCODE = 'check_violation';
END
$$""",
    'CREATE TRIGGER trg_checkpoint_messages_insert_only BEFORE UPDATE ON checkpoint_messages FOR EACH ROW EXECUTE FUNCTION candor_checkpoint_messages_insert_only()',
    """CREATE FUNCTION candor_usage_records_insert_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
RAISE EXCEPTION 'candor: usage_records: rows are insert-only (S-40)' USING ERRCODE = 'check_violation';
END
$$""",
    'CREATE TRIGGER trg_usage_records_insert_only BEFORE UPDATE ON usage_records FOR EACH ROW EXECUTE FUNCTION candor_usage_records_insert_only()',
)

POSTGRESQL_FUNCTIONS = ('candor_runs_status_guard', 'candor_run_attempts_status_guard', 'candor_run_attempts_lease_expires_at_guard', 'candor_checkpoint_messages_insert_only', 'candor_usage_records_insert_only')

TABLES_IN_DROP_ORDER = ('checkpoint_messages', 'usage_records', 'run_attempts', 'checkpoints', 'stream_entries', 'runs', 'inbox_entries', 'threads', 'subscriptions', 'principals', 'outbox', 'workspaces')


def upgrade() -> None:
    op.create_table('workspaces',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('archived_at', sa.Double(), nullable=True),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_workspaces')),
    sa.UniqueConstraint('name', name=op.f('uq_workspaces_name'))
    )
    op.create_table('outbox',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('workspace_id', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('dedupe_key', sa.String(length=512), nullable=False),
    sa.Column('target', sa.Text(), nullable=True),
    sa.Column('payload', JSON, nullable=False),
    sa.Column('signing_secret', sa.Text(), nullable=True),
    sa.Column('subscription_id', sa.String(length=64), nullable=True),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('available_at', sa.Double(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('lease_owner', sa.String(length=200), nullable=True),
    sa.Column('lease_token_hash', sa.String(length=64), nullable=True),
    sa.Column('lease_expires_at', sa.Double(), nullable=True),
    sa.Column('last_error', sa.String(length=1024), nullable=True),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.Column('delivered_at', sa.Double(), nullable=True),
    sa.Column('settled_at', sa.Double(), nullable=True),
    sa.CheckConstraint("kind IN ('webhook', 'child_result', 'checkpoint_cleanup')", name=op.f('ck_outbox_kind')),
    sa.CheckConstraint("status IN ('pending', 'delivered', 'dead')", name=op.f('ck_outbox_status')),
    sa.CheckConstraint('attempts >= 0', name=op.f('ck_outbox_attempts')),
    sa.CheckConstraint('last_error IS NULL OR length(last_error) <= 1024', name=op.f('ck_outbox_last_error')),
    sa.ForeignKeyConstraint(['workspace_id'], ['workspaces.id'], name=op.f('fk_outbox_workspace_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_outbox')),
    sa.UniqueConstraint('kind', 'dedupe_key', name=op.f('uq_outbox_kind_dedupe_key'))
    )
    op.create_index('ix_outbox_due', 'outbox', ['kind', 'available_at', 'id'], unique=False, sqlite_where=sa.text("status = 'pending'"), postgresql_where=sa.text("status = 'pending'"))
    op.create_index('ix_outbox_settled', 'outbox', ['kind', 'status', 'settled_at'], unique=False, sqlite_where=sa.text("status <> 'pending'"), postgresql_where=sa.text("status <> 'pending'"))
    op.create_index(op.f('ix_outbox_subscription_id'), 'outbox', ['subscription_id'], unique=False)
    op.create_index(op.f('ix_outbox_workspace_id'), 'outbox', ['workspace_id'], unique=False)
    op.create_table('principals',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('workspace_id', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('secret_hash', sa.String(length=64), nullable=False),
    sa.Column('permissions', JSON, nullable=False),
    sa.Column('disabled_at', sa.Double(), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.ForeignKeyConstraint(['workspace_id'], ['workspaces.id'], name=op.f('fk_principals_workspace_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_principals')),
    sa.UniqueConstraint('secret_hash', name=op.f('uq_principals_secret_hash'))
    )
    op.create_index(op.f('ix_principals_workspace_id'), 'principals', ['workspace_id'], unique=False)
    op.create_table('subscriptions',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('workspace_id', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('events', JSON, nullable=False),
    sa.Column('filter', JSON, nullable=False),
    sa.Column('enabled', sa.Boolean(), nullable=False),
    sa.Column('signing_secret', sa.Text(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_by_id', sa.String(length=64), nullable=False),
    sa.Column('updated_by_id', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.Column('updated_at', sa.Double(), nullable=False),
    sa.ForeignKeyConstraint(['workspace_id'], ['workspaces.id'], name=op.f('fk_subscriptions_workspace_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_subscriptions')),
    sa.UniqueConstraint('workspace_id', 'name', name=op.f('uq_subscriptions_workspace_id_name'))
    )
    op.create_index(op.f('ix_subscriptions_workspace_id'), 'subscriptions', ['workspace_id'], unique=False)
    op.create_table('threads',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('workspace_id', sa.String(length=64), nullable=False),
    sa.Column('origin', sa.String(length=32), nullable=False),
    sa.Column('origin_thread_id', sa.String(length=64), nullable=True),
    sa.Column('origin_run_id', sa.String(length=64), nullable=True),
    sa.Column('origin_tool_call_id', sa.String(length=256), nullable=True),
    sa.Column('agent', sa.String(length=200), nullable=False),
    sa.Column('base_checkpoint_id', sa.String(length=64), nullable=True),
    sa.Column('current_run_id', sa.String(length=64), nullable=True),
    sa.Column('last_run_id', sa.String(length=64), nullable=True),
    sa.Column('archived_at', sa.Double(), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.Column('updated_at', sa.Double(), nullable=False),
    sa.CheckConstraint("origin IN ('new', 'fork', 'child')", name=op.f('ck_threads_origin')),
    sa.ForeignKeyConstraint(['workspace_id'], ['workspaces.id'], name=op.f('fk_threads_workspace_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_threads'))
    )
    op.create_index(op.f('ix_threads_origin_run_id'), 'threads', ['origin_run_id'], unique=False)
    op.create_index(op.f('ix_threads_workspace_id'), 'threads', ['workspace_id'], unique=False)
    op.create_table('inbox_entries',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('workspace_id', sa.String(length=64), nullable=False),
    sa.Column('thread_id', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('delivery', sa.String(length=32), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('principal_id', sa.String(length=64), nullable=True),
    sa.Column('authority', JSON, nullable=True),
    sa.Column('payload', JSON, nullable=False),
    sa.Column('size', sa.Integer(), nullable=False),
    sa.Column('agent', sa.String(length=200), nullable=True),
    sa.Column('options', JSON, nullable=True),
    sa.Column('options_digest', sa.String(length=64), nullable=True),
    sa.Column('child_run_id', sa.String(length=64), nullable=True),
    sa.Column('request_key', sa.String(length=512), nullable=True),
    sa.Column('request_digest', sa.String(length=64), nullable=True),
    sa.Column('request_kind', sa.String(length=32), nullable=True),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('assigned_run_id', sa.String(length=64), nullable=True),
    sa.Column('incorporated_checkpoint_seq', sa.Integer(), nullable=True),
    sa.Column('failure', JSON, nullable=True),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.Column('finished_at', sa.Double(), nullable=True),
    sa.CheckConstraint("(status = 'consumed') = (incorporated_checkpoint_seq IS NOT NULL)", name=op.f('ck_inbox_entries_consumed_seq')),
    sa.CheckConstraint("delivery IN ('steer', 'next_run')", name=op.f('ck_inbox_entries_delivery')),
    sa.CheckConstraint("kind IN ('message', 'child_result')", name=op.f('ck_inbox_entries_kind')),
    sa.CheckConstraint("request_kind IS NULL OR request_kind IN ('thread', 'message', 'fork')", name=op.f('ck_inbox_entries_request_kind')),
    sa.CheckConstraint("status IN ('pending', 'assigned', 'consumed', 'failed', 'withdrawn')", name=op.f('ck_inbox_entries_status')),
    sa.CheckConstraint('position > 0', name=op.f('ck_inbox_entries_position')),
    sa.ForeignKeyConstraint(['thread_id'], ['threads.id'], name=op.f('fk_inbox_entries_thread_id')),
    sa.ForeignKeyConstraint(['workspace_id'], ['workspaces.id'], name=op.f('fk_inbox_entries_workspace_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_inbox_entries')),
    sa.UniqueConstraint('child_run_id', name=op.f('uq_inbox_entries_child_run_id')),
    sa.UniqueConstraint('principal_id', 'request_key', name=op.f('uq_inbox_entries_principal_id_request_key')),
    sa.UniqueConstraint('thread_id', 'position', name=op.f('uq_inbox_entries_thread_id_position'))
    )
    op.create_index(op.f('ix_inbox_entries_assigned_run_id'), 'inbox_entries', ['assigned_run_id'], unique=False)
    op.create_index(op.f('ix_inbox_entries_thread_id_status'), 'inbox_entries', ['thread_id', 'status'], unique=False)
    op.create_index(op.f('ix_inbox_entries_workspace_id'), 'inbox_entries', ['workspace_id'], unique=False)
    op.create_table('runs',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('workspace_id', sa.String(length=64), nullable=False),
    sa.Column('thread_id', sa.String(length=64), nullable=False),
    sa.Column('agent', sa.String(length=200), nullable=False),
    sa.Column('principal_id', sa.String(length=64), nullable=False),
    sa.Column('authority', JSON, nullable=False),
    sa.Column('options', JSON, nullable=False),
    sa.Column('options_digest', sa.String(length=64), nullable=False),
    sa.Column('source_entry_id', sa.String(length=64), nullable=True),
    sa.Column('resume', JSON, nullable=True),
    sa.Column('resumed_by_id', sa.String(length=64), nullable=True),
    sa.Column('request_key', sa.String(length=512), nullable=True),
    sa.Column('request_digest', sa.String(length=64), nullable=True),
    sa.Column('trigger', sa.String(length=32), nullable=False),
    sa.Column('lineage', sa.String(length=32), nullable=False),
    sa.Column('parent_run_id', sa.String(length=64), nullable=True),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('wait_reason', sa.String(length=32), nullable=True),
    sa.Column('pending', JSON, nullable=True),
    sa.Column('cancel_requested_at', sa.Double(), nullable=True),
    sa.Column('current_attempt_id', sa.String(length=64), nullable=True),
    sa.Column('available_at', sa.Double(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('start_checkpoint_id', sa.String(length=64), nullable=True),
    sa.Column('checkpoint_id', sa.String(length=64), nullable=True),
    sa.Column('checkpoint_seq', sa.Integer(), nullable=False),
    sa.Column('output', JSON, nullable=True),
    sa.Column('failure', JSON, nullable=True),
    sa.Column('usage', JSON, nullable=True),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.Column('started_at', sa.Double(), nullable=True),
    sa.Column('sealed_at', sa.Double(), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.CheckConstraint("(status = 'running') = (current_attempt_id IS NOT NULL)", name=op.f('ck_runs_current_attempt')),
    sa.CheckConstraint("(status = 'waiting') = (pending IS NOT NULL AND wait_reason IS NOT NULL)", name=op.f('ck_runs_pending')),
    sa.CheckConstraint("(status IN ('failed', 'cancelled')) = (failure IS NOT NULL)", name=op.f('ck_runs_failure')),
    sa.CheckConstraint("(status IN ('waiting', 'completed', 'failed', 'cancelled')) = (sealed_at IS NOT NULL)", name=op.f('ck_runs_sealed_at')),
    sa.CheckConstraint("lineage IN ('root', 'continue', 'fork')", name=op.f('ck_runs_lineage')),
    sa.CheckConstraint("status IN ('accepted', 'running', 'waiting', 'completed', 'failed', 'cancelled')", name=op.f('ck_runs_status')),
    sa.CheckConstraint("status NOT IN ('waiting', 'completed') OR checkpoint_seq >= 1", name=op.f('ck_runs_sealed_checkpoint')),
    sa.CheckConstraint("trigger IN ('input', 'queued', 'resume', 'child_result', 'spawned')", name=op.f('ck_runs_trigger')),
    sa.CheckConstraint("wait_reason IS NULL OR wait_reason IN ('approval', 'call', 'multiple')", name=op.f('ck_runs_wait_reason')),
    sa.CheckConstraint('attempts >= 0 AND attempts <= max_attempts', name=op.f('ck_runs_attempts')),
    sa.CheckConstraint('checkpoint_seq >= 0', name=op.f('ck_runs_checkpoint_seq')),
    sa.ForeignKeyConstraint(['thread_id'], ['threads.id'], name=op.f('fk_runs_thread_id')),
    sa.ForeignKeyConstraint(['workspace_id'], ['workspaces.id'], name=op.f('fk_runs_workspace_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('resumed_by_id', 'request_key', name='uq_runs_resume_request')
    )
    op.create_index('ix_runs_due', 'runs', ['available_at', 'id'], unique=False, sqlite_where=sa.text("status = 'accepted'"), postgresql_where=sa.text("status = 'accepted'"))
    op.create_index(op.f('ix_runs_parent_run_id'), 'runs', ['parent_run_id'], unique=False)
    op.create_index(op.f('ix_runs_thread_id_created_at'), 'runs', ['thread_id', 'created_at'], unique=False)
    op.create_index(op.f('ix_runs_workspace_id'), 'runs', ['workspace_id'], unique=False)
    op.create_index('uq_runs_live_thread', 'runs', ['thread_id'], unique=True, sqlite_where=sa.text("status IN ('accepted', 'running')"), postgresql_where=sa.text("status IN ('accepted', 'running')"))
    op.create_table('stream_entries',
    sa.Column('id', ID_INTEGER, autoincrement=True, nullable=False),
    sa.Column('workspace_id', sa.String(length=64), nullable=False),
    sa.Column('thread_id', sa.String(length=64), nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('sequence', sa.Integer(), nullable=False),
    sa.Column('type', sa.String(length=32), nullable=False),
    sa.Column('payload', JSON, nullable=False),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.CheckConstraint("type IN ('delta', 'boundary')", name=op.f('ck_stream_entries_type')),
    sa.ForeignKeyConstraint(['thread_id'], ['threads.id'], name=op.f('fk_stream_entries_thread_id')),
    sa.ForeignKeyConstraint(['workspace_id'], ['workspaces.id'], name=op.f('fk_stream_entries_workspace_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_stream_entries')),
    sqlite_autoincrement=True
    )
    op.create_index(op.f('ix_stream_entries_created_at'), 'stream_entries', ['created_at'], unique=False)
    op.create_index(op.f('ix_stream_entries_thread_id_id'), 'stream_entries', ['thread_id', 'id'], unique=False)
    op.create_index(op.f('ix_stream_entries_workspace_id'), 'stream_entries', ['workspace_id'], unique=False)
    op.create_table('checkpoints',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('workspace_id', sa.String(length=64), nullable=False),
    sa.Column('thread_id', sa.String(length=64), nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=True),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=True),
    sa.Column('format', sa.Integer(), nullable=False),
    sa.Column('base_id', sa.String(length=64), nullable=True),
    sa.Column('kept', sa.Integer(), nullable=False),
    sa.Column('count', sa.Integer(), nullable=False),
    sa.Column('envelope', sa.Text(), nullable=True),
    sa.Column('envelope_digest', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.CheckConstraint('(run_id IS NULL AND seq = 0 AND attempt IS NULL) OR (run_id IS NOT NULL AND seq >= 1 AND attempt >= 1)', name=op.f('ck_checkpoints_seq')),
    sa.CheckConstraint('format >= 1', name=op.f('ck_checkpoints_format')),
    sa.CheckConstraint('kept >= 0 AND kept <= count', name=op.f('ck_checkpoints_kept')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_checkpoints_run_id')),
    sa.ForeignKeyConstraint(['thread_id'], ['threads.id'], name=op.f('fk_checkpoints_thread_id')),
    sa.ForeignKeyConstraint(['workspace_id'], ['workspaces.id'], name=op.f('fk_checkpoints_workspace_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_checkpoints')),
    sa.UniqueConstraint('run_id', 'seq', name=op.f('uq_checkpoints_run_id_seq'))
    )
    op.create_index(op.f('ix_checkpoints_thread_id'), 'checkpoints', ['thread_id'], unique=False)
    op.create_index(op.f('ix_checkpoints_workspace_id'), 'checkpoints', ['workspace_id'], unique=False)
    op.create_table('run_attempts',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('workspace_id', sa.String(length=64), nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('start_reason', sa.String(length=32), nullable=False),
    sa.Column('replaces_attempt_id', sa.String(length=64), nullable=True),
    sa.Column('worker_id', sa.String(length=200), nullable=False),
    sa.Column('worker_build', sa.String(length=200), nullable=True),
    sa.Column('harness_run_id', sa.String(length=64), nullable=True),
    sa.Column('lease_token_hash', sa.String(length=64), nullable=False),
    sa.Column('lease_expires_at', sa.Double(), nullable=False),
    sa.Column('heartbeat_at', sa.Double(), nullable=False),
    sa.Column('yield_reason', sa.String(length=32), nullable=True),
    sa.Column('failure', JSON, nullable=True),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.Column('started_at', sa.Double(), nullable=True),
    sa.Column('finished_at', sa.Double(), nullable=True),
    sa.Column('updated_at', sa.Double(), nullable=False),
    sa.CheckConstraint("start_reason IN ('initial', 'recovery', 'handoff')", name=op.f('ck_run_attempts_start_reason')),
    sa.CheckConstraint("status IN ('leased', 'running', 'succeeded', 'yielded', 'failed', 'cancelled')", name=op.f('ck_run_attempts_status')),
    sa.CheckConstraint("yield_reason IS NULL OR yield_reason IN ('handoff')", name=op.f('ck_run_attempts_yield_reason')),
    sa.CheckConstraint('number >= 1', name=op.f('ck_run_attempts_number')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_run_attempts_run_id')),
    sa.ForeignKeyConstraint(['workspace_id'], ['workspaces.id'], name=op.f('fk_run_attempts_workspace_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_run_attempts')),
    sa.UniqueConstraint('run_id', 'number', name=op.f('uq_run_attempts_run_id_number'))
    )
    op.create_index('ix_run_attempts_live_lease', 'run_attempts', ['lease_expires_at', 'id'], unique=False, sqlite_where=sa.text("status IN ('leased', 'running')"), postgresql_where=sa.text("status IN ('leased', 'running')"))
    op.create_index(op.f('ix_run_attempts_workspace_id'), 'run_attempts', ['workspace_id'], unique=False)
    op.create_index('uq_run_attempts_live_run', 'run_attempts', ['run_id'], unique=True, sqlite_where=sa.text("status IN ('leased', 'running')"), postgresql_where=sa.text("status IN ('leased', 'running')"))
    op.create_table('usage_records',
    sa.Column('id', ID_INTEGER, autoincrement=True, nullable=False),
    sa.Column('workspace_id', sa.String(length=64), nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('attempt_id', sa.String(length=64), nullable=True),
    sa.Column('checkpoint_seq', sa.Integer(), nullable=True),
    sa.Column('usage', JSON, nullable=False),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_usage_records_run_id')),
    sa.ForeignKeyConstraint(['workspace_id'], ['workspaces.id'], name=op.f('fk_usage_records_workspace_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_usage_records'))
    )
    op.create_index(op.f('ix_usage_records_run_id'), 'usage_records', ['run_id'], unique=False)
    op.create_index(op.f('ix_usage_records_workspace_id'), 'usage_records', ['workspace_id'], unique=False)
    op.create_table('checkpoint_messages',
    sa.Column('checkpoint_id', sa.String(length=64), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.CheckConstraint('"index" >= 0', name=op.f('ck_checkpoint_messages_index')),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoints.id'], name=op.f('fk_checkpoint_messages_checkpoint_id')),
    sa.PrimaryKeyConstraint('checkpoint_id', 'index', name=op.f('pk_checkpoint_messages'))
    )
    dialect = op.get_bind().dialect.name
    for statement in SQLITE_TRIGGERS if dialect == "sqlite" else POSTGRESQL_TRIGGERS:
        op.execute(statement)


def downgrade() -> None:
    for table in TABLES_IN_DROP_ORDER:
        op.drop_table(table)
    if op.get_bind().dialect.name == "postgresql":
        for function in POSTGRESQL_FUNCTIONS:
            op.execute(f"DROP FUNCTION IF EXISTS {function}()")
