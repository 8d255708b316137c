"""GCP adapter driven through the real google-cloud-compute client (REST transport)
against the GCE REST test double on loopback, plus the GCE error mapping."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials

from infra.errors import CapacityError, ConfigError, ProviderError, QuotaError, RetryPolicy, TransientError
from infra.gcp import (
    GcpProvider,
    classify,
    instance_name,
    map_api_error,
    request_id,
    split_instance_id,
    to_label,
)
from infra.provider import InstanceState, LaunchRequest, ownership_tags
from tests.infra.conftest import GCP_TEMPLATE, GCP_TEMPLATE_PROPERTIES, free_port
from tests.infra.gce_double import GceDouble, InjectedError

REGION = "us-central1"
USER_DATA = "#cloud-config\nruncmd:\n  - [echo, hi]\n"


def request(n: int, *, zone: str = "us-central1-a", spot: bool = True, token: str | None = None, **kw):
    return LaunchRequest(
        node_id=f"Node_{n}",  # upper case / underscore on purpose: GCE names and labels are stricter
        cluster="Prod-EU",
        region=REGION,
        zone=zone,
        instance_type="g2-standard-8",
        spot=spot,
        template_id=GCP_TEMPLATE,
        user_data=USER_DATA,
        tags={**ownership_tags("Prod-EU", f"Node_{n}", "pool-1"), "Team": "ML Infra"},
        idempotency_token=token or f"launch-{n}",
        **kw,
    )


def inserts(gce: GceDouble) -> list[dict]:
    return [r for r in gce.requests if r["method"] == "POST" and r["path"].endswith("/instances")]


def test_launch_inserts_from_template_with_labels_user_data_and_spot(gcp: GcpProvider, gce: GceDouble):
    inst = gcp.launch(request(1, subnet="projects/p/regions/us-central1/subnetworks/gpu"))

    (call,) = inserts(gce)
    assert call["query"]["sourceInstanceTemplate"] == GCP_TEMPLATE
    assert call["query"]["requestId"] == request_id("launch-1")
    body = call["body"]
    assert body["name"] == "nimbus-node-1"
    assert body["machineType"] == "zones/us-central1-a/machineTypes/g2-standard-8"
    assert body["labels"] == {
        "cost-center": "ml",  # kept from the template
        "managed-by": "nimbus",
        "nimbus-cluster": "prod-eu",
        "nimbus-node-id": "node_1",
        "nimbus-pool-id": "pool-1",
        "team": "ml-infra",
    }
    assert body["metadata"]["items"] == [
        *GCP_TEMPLATE_PROPERTIES["metadata"]["items"],  # the template's security settings survive
        {"key": "user-data", "value": USER_DATA},
    ]
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert body["networkInterfaces"] == [
        {"subnetwork": "projects/p/regions/us-central1/subnetworks/gpu", "stackType": "IPV4_ONLY"}
    ]

    # launch waited on the zone operation (RUNNING for 2 polls) before describing.
    waits = [r for r in gce.requests if r["path"].endswith("/wait")]
    assert len(waits) == 2
    assert inst.state == InstanceState.RUNNING
    assert inst.instance_id == "us-central1-a/nimbus-node-1"
    assert inst.spot is True and inst.zone == "us-central1-a" and inst.region == REGION
    assert inst.private_ip and inst.launched_at is not None
    assert inst.tags["nimbus-node-id"] == "node_1"


def test_on_demand_launch_has_no_spot_scheduling_and_keeps_template_nic(gcp: GcpProvider, gce: GceDouble):
    inst = gcp.launch(request(2, spot=False))
    body = inserts(gce)[0]["body"]
    assert "scheduling" not in body
    assert "networkInterfaces" not in body  # no subnet override: the template's NIC applies
    assert inst.spot is False


def test_template_is_read_once(gcp: GcpProvider, gce: GceDouble):
    for n in range(3):
        gcp.launch(request(n))
    assert sum("instanceTemplates" in r["path"] for r in gce.requests) == 1


def test_retried_launch_reuses_request_id_and_instance(gcp: GcpProvider, gce: GceDouble):
    first = gcp.launch(request(1))
    again = gcp.launch(request(1))
    assert again.instance_id == first.instance_id
    assert len(gce.instances) == 1
    ids = {c["query"]["requestId"] for c in inserts(gce)}
    assert ids == {request_id("launch-1")}


def test_same_node_with_new_token_gets_already_exists_and_returns_existing(gcp: GcpProvider, gce: GceDouble):
    first = gcp.launch(request(1))
    again = gcp.launch(request(1, token="a-different-operation"))
    assert again.instance_id == first.instance_id
    assert len(gce.instances) == 1


def test_describe_terminate_list(gcp: GcpProvider, gce: GceDouble):
    a = gcp.launch(request(1))
    b = gcp.launch(request(2, zone="us-central1-b"))
    c = gcp.launch(request(3, zone="us-central1-b"))
    elsewhere = gcp.launch(
        LaunchRequest(**{**request(4).__dict__, "zone": "europe-west4-a", "region": "europe-west4"})
    )

    found = gcp.list_by_tag(REGION, {"managed-by": "nimbus", "nimbus-cluster": "Prod-EU"})
    assert {i.instance_id for i in found} == {a.instance_id, b.instance_id, c.instance_id}
    assert elsewhere.instance_id not in {i.instance_id for i in found}
    filters = [r["query"].get("filter") for r in gce.requests if "aggregated" in r["path"]]
    assert filters[-1] == '(labels.managed-by = "nimbus") AND (labels.nimbus-cluster = "prod-eu")'
    assert [i.instance_id for i in gcp.list_by_tag(REGION, {"nimbus-node-id": "Node_2"})] == [b.instance_id]

    gcp.terminate(REGION, b.instance_id)
    assert gcp.describe(REGION, b.instance_id) is None
    assert ("us-central1-b", "nimbus-node-2") not in gce.instances
    gcp.terminate(REGION, b.instance_id)  # gone already: fine
    assert {i.instance_id for i in gcp.list_by_tag(REGION, {"managed-by": "nimbus"})} == {
        a.instance_id,
        c.instance_id,
    }


def test_capacity_error_reported_in_operation(gcp: GcpProvider, gce: GceDouble):
    gce.inject(InjectedError("us-central1-a", "ZONE_RESOURCE_POOL_EXHAUSTED", "The zone does not have enough resources"))
    with pytest.raises(CapacityError) as info:
        gcp.launch(request(1))
    assert info.value.scope == "zone"
    assert info.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert gce.instances == {}
    # GCE answers a reused requestId with the original (failed) operation, so each
    # failover attempt needs its own token.
    with pytest.raises(CapacityError):
        gcp.launch(request(1, zone="us-central1-b"))
    assert gcp.launch(request(1, zone="us-central1-b", token="launch-1-b")).zone == "us-central1-b"


def test_all_regions_gpu_quota_blocks_the_cloud(gcp: GcpProvider, gce: GceDouble):
    gce.inject(
        InjectedError("us-central1-a", "QUOTA_EXCEEDED", "Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally.")
    )
    with pytest.raises(QuotaError) as info:
        gcp.launch(request(1))
    assert info.value.scope == "cloud"


def test_regional_quota_over_http_blocks_the_region(gcp: GcpProvider, gce: GceDouble):
    gce.inject(
        InjectedError(
            "us-central1-a",
            "quotaExceeded",
            "Quota 'NVIDIA_L4_GPUS' exceeded. Limit: 4.0 in region us-central1.",
            where="http",
            status=403,
        )
    )
    with pytest.raises(QuotaError) as info:
        gcp.launch(request(1))
    assert info.value.scope == "region"


def test_permission_denied_blocks_the_cloud(gcp: GcpProvider, gce: GceDouble):
    gce.inject(InjectedError("us-central1-a", "forbidden", "Required 'compute.instances.create' permission", where="http", status=403))
    with pytest.raises(ConfigError) as info:
        gcp.launch(request(1))
    assert info.value.scope == "cloud"


def test_rate_limit_is_retried_with_the_same_request_id(gcp: GcpProvider, gce: GceDouble):
    gce.inject(InjectedError("us-central1-a", "rateLimitExceeded", "Rate Limit Exceeded", where="http", status=403, times=2))
    inst = gcp.launch(request(1))
    assert inst.state == InstanceState.RUNNING
    calls = inserts(gce)
    assert len(calls) == 3
    assert len({c["query"]["requestId"] for c in calls}) == 1


def test_rate_limit_that_persists_surfaces_as_transient(gcp: GcpProvider, gce: GceDouble):
    gce.inject(InjectedError("us-central1-a", "rateLimitExceeded", "slow down", where="http", status=429, times=9))
    with pytest.raises(TransientError):
        gcp.launch(request(1))
    assert gce.instances == {}


def test_missing_template_is_a_regional_config_error(gcp: GcpProvider, gce: GceDouble):
    bad = LaunchRequest(**{**request(1).__dict__, "template_id": "projects/x/global/instanceTemplates/nope"})
    with pytest.raises(ConfigError) as info:
        gcp.launch(bad)
    assert info.value.scope == "region"


def test_spot_preempted_node_is_gone(gcp: GcpProvider, gce: GceDouble):
    inst = gcp.launch(request(1))
    zone, name = split_instance_id(inst.instance_id)
    gce.preempt(zone, name)
    assert gcp.describe(REGION, inst.instance_id) is None
    assert gcp.list_by_tag(REGION, {"managed-by": "nimbus"}) == []


# -- pure pieces --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "message", "status", "kind", "scope"),
    [
        ("ZONE_RESOURCE_POOL_EXHAUSTED", "", 503, CapacityError, "zone"),
        ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "", 503, CapacityError, "zone"),
        ("insufficientCapacity", "", 0, CapacityError, "zone"),
        ("QUOTA_EXCEEDED", "Quota 'NVIDIA_A100_GPUS' exceeded in region us-central1", 0, QuotaError, "region"),
        ("QUOTA_EXCEEDED", "Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally.", 0, QuotaError, "cloud"),
        ("quotaExceeded", "Quota 'GPUS_ALL_REGIONS' exceeded.", 403, QuotaError, "cloud"),
        ("forbidden", "", 403, ConfigError, "cloud"),
        ("", "", 401, ConfigError, "cloud"),
        ("rateLimitExceeded", "", 403, TransientError, "none"),
        ("", "", 503, TransientError, "none"),
        ("invalid", "Invalid value for field 'resource.networkInterfaces[0].subnetwork'", 400, ConfigError, "region"),
        ("invalid", "Machine type with name 'a2-ultragpu-8g' does not exist in zone 'us-central1-f'.", 400, CapacityError, "zone"),
        ("SOMETHING_NEW", "", 0, ProviderError, "zone"),
    ],
)
def test_gce_error_classification(code, message, status, kind, scope):
    err = classify(code, message or code, status)
    assert type(err) is kind and err.scope == scope


def test_api_core_exception_reason_is_used():
    exc = gexc.Forbidden("Quota 'GPUS_ALL_REGIONS' exceeded.", errors=[{"reason": "quotaExceeded"}])
    err = map_api_error(exc)
    assert isinstance(err, QuotaError) and err.scope == "cloud"


def test_labels_and_names_follow_gce_rules():
    assert to_label("Nimbus-Cluster") == "nimbus-cluster"
    assert to_label("a b/c.d") == "a-b-c-d"
    assert len(to_label("x" * 100)) == 63
    long_name = instance_name("N" * 80)
    assert len(long_name) <= 63 and long_name.startswith("nimbus-n")
    assert instance_name("N" * 80) == long_name and instance_name("N" * 81) != long_name
    assert request_id("123e4567-e89b-12d3-a456-426614174000") == "123e4567-e89b-12d3-a456-426614174000"
    assert request_id("op-1") == request_id("op-1") != request_id("op-2")


def test_unreachable_endpoint_is_transient():
    provider = GcpProvider(
        "p",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": f"http://127.0.0.1:{free_port()}"},
        retry_policy=RetryPolicy(attempts=1),
    )
    with pytest.raises(TransientError):
        provider.describe(REGION, "us-central1-a/x")
