"""docs/alerts.yml ships the §10.5 alert rules and candor's connection alert (§7.8.1), each written against a metric declared in `service/metrics.py`."""

from __future__ import annotations

import re
from pathlib import Path

from candor.service.metrics import METRIC_NAMES

RULES = Path(__file__).resolve().parents[3] / "docs" / "alerts.yml"

EXPECTED = {
    "CandorOutboxBacklog": "candor_outbox_backlog_alert",
    "CandorOutboxDead": "candor_outbox_dead",
    "CandorServiceDown": None,  # `up`, Prometheus' own scrape metric
    "CandorServiceErrors": "candor_http_request_duration_seconds",
    "CandorBacklogStuck": "candor_backlog_oldest_age_seconds",
    "CandorWorkersSaturated": "candor_worker_slots",
    "CandorRunFailures": "candor_runs_sealed_total",
    "CandorSweepFailing": "candor_sweep_passes_total",
    "CandorDatabaseConnectionsExhausted": "candor_db_connections",  # candor's own (§7.8.1, docs/operations.md)
}


def _rules() -> dict[str, dict[str, str]]:
    """alert name → its fields, read from the file's `- alert:` items (PyYAML is not a dependency)."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        yaml = None
    text = RULES.read_text(encoding="utf-8")
    if yaml is not None:
        document = yaml.safe_load(text)
        return {
            rule["alert"]: {key: str(value) for key, value in rule.items()}
            for group in document["groups"]
            for rule in group["rules"]
        }
    rules: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        match = re.match(r"^\s*- alert:\s*(\S+)\s*$", line)
        if match:
            current = rules.setdefault(match.group(1), {"alert": match.group(1)})
            continue
        field = re.match(r"^\s+(expr|for):\s*(.+?)\s*$", line)
        if field and current is not None:
            current[field.group(1)] = field.group(2)
    return rules


def _base(name: str) -> str:
    return re.sub(r"_(bucket|sum|count)$", "", name)


def test_alert_rules_cover_the_spec_and_use_declared_metrics() -> None:
    """§10.5: every alert is present once, and each `candor_*` name in an expression is a declared metric."""
    rules = _rules()
    assert set(rules) == set(EXPECTED)
    for name, metric in EXPECTED.items():
        expr = rules[name]["expr"]
        used = {_base(found) for found in re.findall(r"\bcandor_[a-z_]+", expr)}
        assert used <= METRIC_NAMES, (name, used - METRIC_NAMES)
        if metric is not None:
            assert metric in used, name
    assert rules["CandorServiceDown"]["for"] == "5m"
    assert rules["CandorBacklogStuck"]["for"] == "5m"
    assert rules["CandorWorkersSaturated"]["for"] == "10m"
    assert "[15m]" in rules["CandorSweepFailing"]["expr"]
