"""The Grafana dashboard refers only to metrics that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
