"""Alembic environment and revisions of the service schema; configured programmatically by store/schema/migration.py."""
