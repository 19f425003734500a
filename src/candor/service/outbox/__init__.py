"""Outbox delivery (§9): per-kind claim → handler → settle, and the webhook POST."""
