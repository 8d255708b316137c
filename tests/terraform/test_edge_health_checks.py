"""DNS steers at the model level (issue 20, item 7): the Route 53 health checks probe the edge's
region readiness (``/health/ready``, failing when a model it should serve has no healthy replica or
its snapshot is stale), while the checks that replace or restart edges (the ALB's target group,
Cloud Run's probes) keep the liveness ``/health``."""

from __future__ import annotations

from dataplane.edge import routes

from .hcl import MODULES_ROOT, blocks, resources

READY = "/health/ready"


def _route(path: str) -> bool:
    """The edge answers GET on this path (its route table, dataplane/edge/routes.py)."""
    found = routes.match(path)
    return found is not None and "GET" in found[0].methods


def test_route53_health_checks_probe_the_edges_region_readiness():
    dns = MODULES_ROOT / "aws" / "dns"
    checks = [body for kind, _, body in resources(dns) if kind == "aws_route53_health_check"]
    assert checks and all(c["resource_path"] == "${var.health_check_path}" for c in checks)
    assert blocks(dns, "variable")["health_check_path"]["default"] == READY
    dns_call = blocks(MODULES_ROOT / "aws" / "platform", "module")["dns"]
    assert dns_call["source"] == "../dns" and dns_call["health_check_path"] == READY
    # every latency record, the AWS edges' and the external (GCP) ones, is tied to such a check
    records = [body for kind, _, body in resources(dns) if kind == "aws_route53_record"]
    assert records and all("aws_route53_health_check.edge" in str(r["health_check_id"]) for r in records)
    assert _route(READY)


def test_replacing_checks_stay_on_liveness():
    """A model outage must not get edges replaced: the ALB and Cloud Run keep /health."""
    aws_edge = blocks(MODULES_ROOT / "aws" / "edge", "module")["alb"]
    gcp_edge = blocks(MODULES_ROOT / "gcp" / "edge", "module")["service"]
    assert aws_edge["health_check_path"] == "/health" and gcp_edge["health_check_path"] == "/health"
    assert _route("/health")
