"""The failover walk, driven through a real provider (local) and the GCE test double."""

from __future__ import annotations

from datetime import UTC, datetime

from google.auth.credentials import AnonymousCredentials

from infra.catalog import load_catalog
from infra.errors import CapacityError, RetryPolicy
from infra.failover import attempt_token, find_launched, launch_first_available
from infra.gcp import GcpProvider
from infra.placement import VariantNeeds, candidates
from infra.provider import LaunchRequest, ownership_tags
from tests.infra.conftest import GCP_PROJECT, GCP_TEMPLATE_EAST4, catalog_dict
from tests.infra.gce_double import GceDouble, InjectedError

NEEDS = VariantNeeds(gpu_count=1, gpu_memory_gb=24)


def gcp_catalog():
    data = catalog_dict()
    region = data["clouds"][1]["regions"][0]
    region["zones"].append({"name": "us-central1-c"})
    template = {"kind": "gcp_instance_template", "id": GCP_TEMPLATE_EAST4}
    second = {**region, "name": "us-east4", "zones": [{"name": "us-east4-a"}], "template": template}
    data["clouds"][1]["regions"].append(second)
    return load_catalog(data)


def launcher(provider, operation_id: str, node_id: str):
    def launch(c):
        return provider.launch(
            LaunchRequest(
                node_id=node_id,
                cluster="c1",
                region=c.region,
                zone=c.zone,
                instance_type=c.instance_type,
                spot=c.spot,
                template_id=c.template_id,
                user_data="#cloud-config\n",
                tags=ownership_tags("c1", node_id, "pool-1"),
                idempotency_token=attempt_token(operation_id, c),
                subnet=c.subnet,
            )
        )

    return launch


def clock():
    return datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_capacity_then_quota_then_success_records_history_and_blocks(gcp: GcpProvider, gce: GceDouble):
    catalog = gcp_catalog()
    gce.inject(InjectedError("us-central1-a", "ZONE_RESOURCE_POOL_EXHAUSTED", "no L4 left", times=5))
    gce.inject(InjectedError("us-central1-b", "QUOTA_EXCEEDED", "Quota 'NVIDIA_L4_GPUS' exceeded in region", times=5))
    cs = candidates(catalog, ["gcp"], NEEDS, "spot", [], clock())
    assert [c.zone for c in cs] == ["us-central1-a", "us-central1-b", "us-central1-c", "us-east4-a"]

    result = launch_first_available(cs, launcher(gcp, "op-42", "node-7"), clock)

    assert result.instance is not None and result.instance.zone == "us-east4-a"
    history = [(a.candidate.zone, a.ok, a.error_code, a.error_scope) for a in result.attempts]
    # us-central1-c is skipped without a call: the quota error blocked its region.
    assert history == [
        ("us-central1-a", False, "ZONE_RESOURCE_POOL_EXHAUSTED", "zone"),
        ("us-central1-b", False, "QUOTA_EXCEEDED", "region"),
        ("us-east4-a", True, None, None),
    ]
    assert [(b.scope, b.zone or b.region) for b in result.new_blocks] == [
        ("zone", "us-central1-a"),
        ("region", "us-central1"),
    ]
    assert result.candidate.zone == "us-east4-a"
    assert result.attempts[0].as_dict()["error_code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert len(gce.instances) == 1  # failed attempts left nothing behind


def test_retry_after_crash_adopts_the_vm_instead_of_launching_another(gce: GceDouble):
    provider = GcpProvider(
        GCP_PROJECT,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": gce.endpoint},
        retry_policy=RetryPolicy(attempts=1),
    )
    cs = candidates(gcp_catalog(), ["gcp"], NEEDS, "spot", [], clock())
    first = launch_first_available(cs, launcher(provider, "op-1", "node-9"), clock)
    # The worker "crashes" before recording the result; the retried task looks first.
    regions = [(provider, "us-central1"), (provider, "us-east4")]
    adopted = find_launched(regions, "c1", "node-9")
    assert adopted is not None and adopted.instance_id == first.instance.instance_id
    assert find_launched(regions, "c1", "node-10") is None


def test_walk_stops_after_max_attempts_and_reports_no_instance(local):
    catalog = load_catalog(
        {
            "version": 1,
            "clouds": [
                {
                    "name": "local",
                    "regions": [
                        {
                            "name": "local",
                            "template": {"kind": "local", "id": "local"},
                            "zones": [{"name": f"local-{z}"} for z in "abc"],
                            "instance_types": [
                                {"name": "cpu", "gpu_type": "sim", "gpu_count": 1, "gpu_memory_gb": 80, "on_demand_price": 0}
                            ],
                        }
                    ],
                }
            ],
        }
    )
    cs = candidates(catalog, ["local"], NEEDS, "on_demand", [], clock())
    calls = []

    def always_full(c):
        calls.append(c.zone)
        raise CapacityError("full", code="Full")

    result = launch_first_available(cs, always_full, clock, max_attempts=2)
    assert result.instance is None and calls == ["local-a", "local-b"]
    assert len(result.new_blocks) == 2

    ok = launch_first_available(cs, launcher(local, "op-x", "node-1"), clock)
    assert ok.instance is not None and ok.instance.zone == "local-a"


def test_attempt_tokens_are_stable_per_candidate_and_fit_ec2():
    cs = candidates(gcp_catalog(), ["gcp"], NEEDS, "spot_with_fallback", [], clock())
    tokens = [attempt_token("x" * 80, c) for c in cs]
    assert len(set(tokens)) == len(cs)
    assert tokens == [attempt_token("x" * 80, c) for c in cs]
    assert all(len(t) <= 64 for t in tokens)


def test_preempted_spot_node_is_replaced_in_another_zone_first(gcp: GcpProvider, gce: GceDouble):
    catalog = gcp_catalog()
    cs = candidates(catalog, ["gcp/us-central1"], NEEDS, "spot", [], clock())
    node = launch_first_available(cs, launcher(gcp, "op-1", "node-1"), clock).instance
    assert node.zone == "us-central1-a"

    zone, name = node.instance_id.split("/")
    gce.preempt(zone, name)
    assert gcp.describe(node.region, node.instance_id) is None

    again = candidates(catalog, ["gcp/us-central1"], NEEDS, "spot", [], clock(), avoid_zones=[node.zone])
    assert again[-1].zone == node.zone  # still allowed, but last
    replacement = launch_first_available(again, launcher(gcp, "op-2", "node-2"), clock).instance
    assert replacement.zone == "us-central1-b" and replacement.spot
