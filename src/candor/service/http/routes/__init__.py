"""HTTP routes, one module per resource: threads, runs, ops (health, readiness, metrics)."""
