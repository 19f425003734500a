"""candor.service: the host that runs candor agents durably behind an HTTP API (spec service.md)."""
