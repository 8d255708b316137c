"""Pure parts: how many nodes to add (and in which market), which to remove, placement and bootstrap."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from controlplane.config import Settings
from controlplane.fleet import node_bootstrap, placement_catalog
from controlplane.fleet.provisioning import NodeView, PoolPlan, markets_for_new_nodes, plan_pool
from controlplane.models import NodeState, SpotPolicy
from infra.bootstrap import parse_user_data
from infra.catalog import load_catalog
from infra.placement import Candidate, PlacementPreference
from tests.provisioning.conftest import gcp_catalog

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
S = NodeState


def view(state: NodeState, minutes: int = 0, spot: bool = False) -> NodeView:
    return NodeView(uuid.uuid4(), state, spot, T0 + dt.timedelta(minutes=minutes))


def test_missing_capacity_becomes_launches():
    nodes = [view(S.ready), view(S.draining), view(S.terminating)]
    assert plan_pool(3, SpotPolicy.on_demand, 0, nodes) == PoolPlan(launch=(False, False))


def test_at_size_does_nothing():
    assert plan_pool(2, SpotPolicy.on_demand, 0, [view(S.ready), view(S.booting)]) == PoolPlan()


def test_removal_prefers_not_ready_then_newest():
    old_ready, new_ready = view(S.ready, 0), view(S.ready, 5)
    booting, pending = view(S.booting, 1), view(S.pending, 2)
    plan = plan_pool(1, SpotPolicy.on_demand, 0, [old_ready, new_ready, booting, pending])
    assert plan.remove == (pending.id, booting.id, new_ready.id)
    assert plan.launch == ()


def test_removal_keeps_the_on_demand_floor():
    floor, spot_old, spot_new = view(S.ready, 9, spot=False), view(S.ready, 0, True), view(S.ready, 1, True)
    plan = plan_pool(1, SpotPolicy.spot_with_fallback, 1, [floor, spot_old, spot_new])
    assert set(plan.remove) == {spot_old.id, spot_new.id}


@pytest.mark.parametrize(
    ("policy", "base", "on_demand_now", "count", "expected"),
    [
        (SpotPolicy.on_demand, 0, 0, 2, [False, False]),
        (SpotPolicy.spot, 3, 0, 2, [True, True]),
        (SpotPolicy.spot_with_fallback, 2, 0, 3, [False, False, True]),
        (SpotPolicy.spot_with_fallback, 2, 1, 3, [False, True, True]),
        (SpotPolicy.spot_with_fallback, 1, 4, 2, [True, True]),
    ],
)
def test_markets_for_new_nodes(policy, base, on_demand_now, count, expected):
    assert markets_for_new_nodes(policy, base, on_demand_now, count) == expected


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


VARIANT = node_bootstrap.VariantSpec(
    id=uuid.uuid4(), model_name="llama", tier="fp8", model_path="meta-llama/Llama-3.1-8B-Instruct-FP8",
    quantization="fp8", gpu_count=2, engine_args={"mem_fraction_static": 0.85, "enable-torch-compile": True,
                                                  "disable_radix_cache": False},
)
CANDIDATE = Candidate("gcp", "us-central1", "us-central1-a", "g2-standard-24", True, 1.0, "tpl", None)


def test_user_data_carries_config_and_only_the_bootstrap_token():
    settings = Settings(public_url="https://cp.example.test", cluster_name="prod")
    node_id, pool_id = uuid.uuid4(), uuid.uuid4()
    text = node_bootstrap.user_data(
        settings, node_id=node_id, pool_id=pool_id, variant=VARIANT, candidate=CANDIDATE,
        catalog=load_catalog(gcp_catalog()), bootstrap_token="one-time-token", token_expires_at=T0 + dt.timedelta(minutes=30),
        now=T0,
    )
    config = parse_user_data(text)
    assert (config.node_id, config.pool_id, config.variant) == (str(node_id), str(pool_id), str(VARIANT.id))
    assert config.control_plane_url == "https://cp.example.test" and config.cluster == "prod"
    assert (config.cloud, config.region, config.zone) == ("gcp", "us-central1", "us-central1-a")
    assert config.bootstrap_token == "one-time-token"
    assert config.model_cache_dir and config.artifact_cache_dir


def test_variant_engine_args_never_reach_user_data():
    """Variant flags (possibly credentials) reach the agent only after it registers."""
    leaky = node_bootstrap.VariantSpec(**{**VARIANT.__dict__, "engine_args": {"api_key": "sk-live-123"}})
    text = node_bootstrap.user_data(
        Settings(), node_id=uuid.uuid4(), pool_id=uuid.uuid4(), variant=leaky, candidate=CANDIDATE,
        catalog=load_catalog(gcp_catalog()), bootstrap_token="t", token_expires_at=T0 + dt.timedelta(minutes=5),
        now=T0,
    )
    assert "sk-live-123" not in text
    config = parse_user_data(text)
    assert config.engine == "auto" and config.engine_args == ()
