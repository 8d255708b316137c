"""The Grafana dashboard refers only to metrics that exist; the share guard's rules."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dataplane.edge.fairness import ShareGuard
from dataplane.edge.metrics import EdgeMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "dataplane" / "edge" / "grafana" / "nimbus.json"


def test_dashboard_is_valid_and_uses_real_edge_metrics():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "nimbus-platform" and dash["panels"]
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"nimbus_edge_[a-z_]+", e)}
    metrics = EdgeMetrics()
    exported = set()
    for family in metrics.registry.collect():
        exported.add(family.name)
        for suffix in ("_total", "_bucket", "_sum", "_count"):
            exported.add(family.name + suffix)
    assert used and used <= exported, used - exported
    # every panel group the issue asks for is there
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for word in ("first token", "inter-token", "queue time", "errors", "retries", "routing", "prefix"):
        assert word in titles


def test_share_guard_only_binds_a_heavy_tenant_over_its_share():
    g = ShareGuard(burst_slots=1, active_window_s=10)
    now = 0.0
    for t in ("a", "b", "c", "d"):
        g.seen(t, now)
    # evenly loaded tenants never hold each other back, even over their share
    for t in ("a", "b", "c"):
        g.acquired(t, now)
    for _ in range(3):
        g.acquired("d", now)
    assert g.allows("a", free_slots=1, total_slots=8, now=now)
    # "flood" dispatches at many times the others' rate and holds its share: it must leave room
    g.seen("flood", now)
    for i in range(40):
        now = i * 0.05
        g.seen("flood", now)
    for _ in range(3):
        g.acquired("flood", now)
    assert not g.allows("flood", free_slots=1, total_slots=8, now=now)
    assert g.allows("a", free_slots=1, total_slots=8, now=now)  # the quiet ones still get in
    assert g.allows("flood", free_slots=8, total_slots=16, now=now)  # plenty free: work-conserving


def test_share_guard_lets_a_lone_tenant_use_everything():
    g = ShareGuard()
    g.seen("solo", 0)
    for _ in range(7):
        g.acquired("solo", 0)
    assert g.allows("solo", free_slots=1, total_slots=8, now=0)
