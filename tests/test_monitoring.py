"""The alert rules and the Grafana dashboard shipped in infra/monitoring/: valid (promtool), firing
when they should (promtool's rule unit tests), and naming only metrics the loader exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from loader.metrics import Metrics

MONITORING = Path(__file__).resolve().parents[1] / "infra" / "monitoring"
_METRIC = re.compile(r"\bloader_[a-z_]+\b")


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: 'make test' installs Debian's prometheus package (make deps)")
    return found


def _exported() -> set[str]:
    """Every series name follow mode's registry exposes (counters with _total, histograms' parts)."""
    m = Metrics()
    m.note_slot(0, "reserved")
    m.note_heartbeat(0.0)
    m.changes.labels(stage="capture").inc(0)
    m.cycles.labels(result="work").inc(0)
    m.outages.labels(server="source").inc(0)
    m.cycle_seconds.observe(1.0)
    from datetime import UTC, datetime

    m.table_fresh_as_of("public.t", datetime.now(UTC))
    m.verify_differences.labels(table="public.t").set(0)
    m.load_batches.labels(engine="driver").inc()
    text = generate_latest(m.registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_alert_rules_are_valid_and_fire_as_their_unit_tests_say() -> None:
    promtool = _promtool()
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        out = subprocess.run([promtool, *args], cwd=MONITORING, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr


def test_alerts_and_dashboard_name_only_exported_metrics() -> None:
    exported = _exported()
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    named = {name for e in exprs for name in _METRIC.findall(str(e))}
    assert named, "no metric named at all"
    unknown = named - exported
    assert not unknown, f"not exported by loader.metrics: {sorted(unknown)} (exported: {sorted(exported)})"
    # Every gauge a user should watch is on the dashboard.
    for must in ("loader_slot_retained_wal_bytes", "loader_heartbeat_age_seconds", "loader_parked_tables"):
        assert must in named
