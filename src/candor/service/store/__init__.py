"""All SQL of the service: tables, dialect branches, engines, migrations and named statements (STYLE §1)."""
