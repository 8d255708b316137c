"""Pure parts of provisioning: a pool's placement list against the catalog, the offers placement
launches from, and what a new node is told at boot.

Placement, the spot/on-demand split and consolidation have their own tests in tests/fleet/.
"""

from __future__ import annotations

import datetime as dt
import inspect
import uuid

from controlplane.config import Settings
from controlplane.fleet import node_bootstrap, placement_catalog
from controlplane.fleet.capacity import PlacementPref
from infra.bootstrap import parse_user_data
from infra.catalog import load_catalog
from infra.placement import BlockEntry, Candidate, PlacementPreference
from tests.provisioning.conftest import gcp_catalog

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def test_pool_zones_expand_to_preferences_in_order():
    prefs = placement_catalog.preferences(
        [{"cloud": "gcp", "region": "us-central1", "zones": ["us-central1-b", "us-central1-a"]},
         {"cloud": "gcp", "region": "us-east4"}]
    )
    assert prefs == [
        PlacementPreference("gcp", "us-central1", "us-central1-b"),
        PlacementPreference("gcp", "us-central1", "us-central1-a"),
        PlacementPreference("gcp", "us-east4", None),
    ]
    catalog = load_catalog(gcp_catalog())
    assert placement_catalog.regions_of(catalog, [{"cloud": "gcp", "region": "us-east4"}, {"cloud": "gcp"}]) == [
        ("gcp", "us-east4"), ("gcp", "us-central1")]


def test_placement_list_becomes_placement_prefs_for_the_fleet():
    assert placement_catalog.placement_prefs(
        [{"cloud": "gcp", "region": "us-central1", "zones": ["us-central1-b"]}, {"cloud": "aws"}]
    ) == (PlacementPref("gcp", "us-central1", ("us-central1-b",)), PlacementPref("aws", None, ()))


def test_offers_cover_every_shape_and_market_and_leave_out_blocked_zones():
    catalog = load_catalog(gcp_catalog())
    offers = {(o.region, o.spot): o for o in placement_catalog.offers(catalog, [], T0)}
    assert set(offers) == {("us-central1", False), ("us-central1", True), ("us-east4", False), ("us-east4", True)}
    central = offers[("us-central1", False)]
    assert (central.instance_type, central.gpu_type, central.gpu_count, central.price_per_hour, central.zones) == (
        "g2-standard-8", "l4", 1, 0.85, ("us-central1-a", "us-central1-b"))
    assert offers[("us-central1", True)].price_per_hour == 0.3
    blocks = [
        # A capacity error on spot in one zone blocks that zone for spot only …
        BlockEntry("zone", "gcp", "us-central1", "us-central1-a", T0 + dt.timedelta(minutes=5), "capacity",
                   spot=True),
        # … a quota error the whole region; an expired block nothing.
        BlockEntry("region", "gcp", "us-east4", None, T0 + dt.timedelta(minutes=5), "quota"),
        BlockEntry("zone", "gcp", "us-central1", "us-central1-b", T0 - dt.timedelta(seconds=1), "expired"),
    ]
    blocked = {(o.region, o.spot): o.zones for o in placement_catalog.offers(catalog, blocks, T0)}
    assert blocked == {
        ("us-central1", False): ("us-central1-a", "us-central1-b"),
        ("us-central1", True): ("us-central1-b",),
        ("us-east4", False): (),
        ("us-east4", True): (),
    }


CANDIDATE = Candidate("gcp", "us-central1", "us-central1-a", "g2-standard-24", True, 1.0, "tpl", None)


def test_user_data_carries_config_and_only_the_bootstrap_token():
    settings = Settings(public_url="https://cp.example.test", cluster_name="prod")
    node_id = uuid.uuid4()
    text = node_bootstrap.user_data(
        settings, node_id=node_id, candidate=CANDIDATE, catalog=load_catalog(gcp_catalog()),
        bootstrap_token="one-time-token", token_expires_at=T0 + dt.timedelta(minutes=30), now=T0,
    )
    config = parse_user_data(text)
    assert config.node_id == str(node_id)
    # A node hosts replicas of any pool: which ones comes over the agent API, never in user data.
    assert config.pool_id is None and config.variant == ""
    assert config.control_plane_url == "https://cp.example.test" and config.cluster == "prod"
    assert (config.cloud, config.region, config.zone) == ("gcp", "us-central1", "us-central1-a")
    assert dict(config.labels) == {"instance_type": "g2-standard-24", "market": "spot"}
    assert config.bootstrap_token == "one-time-token"
    assert config.bootstrap_token_expires_at == T0 + dt.timedelta(minutes=30)
    assert config.model_cache_dir and config.artifact_cache_dir


def test_engine_args_never_reach_user_data():
    """Variant flags (possibly credentials) reach the agent only after it registers, in its replica list."""
    text = node_bootstrap.user_data(
        Settings(), node_id=uuid.uuid4(), candidate=CANDIDATE, catalog=load_catalog(gcp_catalog()),
        bootstrap_token="t", token_expires_at=T0 + dt.timedelta(minutes=5), now=T0,
    )
    config = parse_user_data(text)
    assert config.engine == "auto" and config.engine_args == () and config.variant == ""
    # Nothing pool- or variant-specific can be passed in: the node is not any pool's.
    assert set(inspect.signature(node_bootstrap.user_data).parameters) == {
        "settings", "node_id", "candidate", "catalog", "bootstrap_token", "token_expires_at", "now"}


def test_artifact_source_is_the_regions_bucket():
    doc = gcp_catalog()
    doc["clouds"][0]["regions"][0]["artifact_bucket"] = "gs://nimbus-artifacts-central"
    catalog = load_catalog(doc)
    assert node_bootstrap.artifact_source(catalog, "gcp", "us-central1") == "gs://nimbus-artifacts-central"
    assert node_bootstrap.artifact_source(catalog, "gcp", "us-east4") is None
    text = node_bootstrap.user_data(
        Settings(), node_id=uuid.uuid4(), candidate=CANDIDATE, catalog=catalog, bootstrap_token="t",
        token_expires_at=T0 + dt.timedelta(minutes=5), now=T0,
    )
    assert parse_user_data(text).artifact_source == "gs://nimbus-artifacts-central"
