"""Alembic environment and revisions of the service schema; configured programmatically by store/migrate.py."""
