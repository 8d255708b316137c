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
    # the requests the fair queue served past their SLO deadline (fairness.py) are on it too
    assert "nimbus_edge_dispatched_late_total" in used


def test_loop_histogram_renders_exactly_as_a_prometheus_histogram():
    """The lock-free inter-token histogram must be indistinguishable, on /metrics, from
    prometheus_client's own (same buckets, le labels, counts and sum)."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from dataplane.edge.metrics import ITL_BUCKETS

    gaps = [0.0004, 0.001, 0.0011, 0.004, 0.02, 0.3, 0.3, 2.0, 7.5]  # on, between and past the bounds
    metrics = EdgeMetrics()
    for gap in gaps:
        metrics.child(metrics.itl, "demo", "r1", "interactive").observe(gap)
    metrics.child(metrics.itl, "demo", "r2", "batch").observe(0.05)
    ours = {line for line in metrics.render().decode().splitlines()
            if line.startswith("nimbus_edge_inter_token_seconds")}

    reference = CollectorRegistry()
    hist = Histogram("nimbus_edge_inter_token_seconds", "Gap between streamed chunks",
                     ["model", "replica", "priority"], buckets=ITL_BUCKETS, registry=reference)
    for gap in gaps:
        hist.labels("demo", "r1", "interactive").observe(gap)
    hist.labels("demo", "r2", "batch").observe(0.05)
    theirs = {line for line in generate_latest(reference).decode().splitlines()
              if line.startswith("nimbus_edge_inter_token_seconds") and "_created" not in line}
    assert ours == theirs and len(ours) == 2 * (len(ITL_BUCKETS) + 3)
