"""Candidate ordering and failover scopes (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.catalog import load_catalog
from infra.errors import CapacityError, ConfigError, ProviderError, QuotaError, TransientError
from infra.placement import (
    BlockEntry,
    Candidate,
    PlacementPreference,
    VariantNeeds,
    block_for,
    candidates,
)
from tests.infra.conftest import catalog_dict

L40S = VariantNeeds(gpu_count=1, gpu_memory_gb=40)
ANY_24G = VariantNeeds(gpu_count=1, gpu_memory_gb=24)
EAST = [{"cloud": "aws", "region": "us-east-1"}]


@pytest.fixture
def catalog():
    return load_catalog(catalog_dict())


def where(cs: list[Candidate]) -> list[tuple[str, str, bool]]:
    return [(c.zone, c.instance_type, c.spot) for c in cs]


def test_on_demand_orders_by_preference_then_price_and_filters_by_needs(catalog, now):
    cs = candidates(catalog, ["aws/us-west-2", "aws/us-east-1"], L40S, "on_demand", [], now)
    # g5 (24 GB per GPU) is too small; g6e (48 GB) and p5 (8×80 GB) fit.
    assert where(cs) == [
        ("us-west-2a", "g6e.xlarge", False),
        ("us-west-2b", "g6e.xlarge", False),
        ("us-east-1a", "g6e.xlarge", False),
        ("us-east-1b", "g6e.xlarge", False),
        ("us-east-1c", "g6e.xlarge", False),
        ("us-east-1a", "p5.48xlarge", False),  # fits too (8×80 GB), but costs 98 $/h
    ]
    assert cs[0].template_id == "lt-west" and cs[2].template_id == "lt-east"
    assert cs[2].subnet == "subnet-a" and cs[0].subnet is None
    assert cs[0].price == 2.0


def test_cheaper_type_is_tried_in_every_zone_before_a_dearer_one(catalog, now):
    cs = candidates(catalog, EAST, ANY_24G, "on_demand", [], now)
    assert [c.instance_type for c in cs[:3]] == ["g5.xlarge"] * 3
    assert [c.zone for c in cs[:3]] == ["us-east-1a", "us-east-1b", "us-east-1c"]
    assert [c.instance_type for c in cs[3:6]] == ["g6e.xlarge"] * 3


def test_spot_with_fallback_puts_all_spot_first_within_a_preference(catalog, now):
    cs = candidates(catalog, ["aws/us-east-1", "gcp"], ANY_24G, "spot_with_fallback", [], now)
    markets = [(c.cloud, c.spot) for c in cs]
    # aws spot (p5 has no spot price), aws on-demand, then gcp spot, gcp on-demand.
    assert markets == [("aws", True)] * 6 + [("aws", False)] * 7 + [("gcp", True)] * 2 + [("gcp", False)] * 2
    assert cs[0].price == 0.4 and cs[6].price == 1.0


def test_spot_only_and_on_demand_only(catalog, now):
    assert all(c.spot for c in candidates(catalog, EAST, ANY_24G, "spot", [], now))
    assert not any(c.spot for c in candidates(catalog, EAST, ANY_24G, "on_demand", [], now))
    big = VariantNeeds(gpu_count=8, gpu_memory_gb=80)
    assert candidates(catalog, EAST, big, "spot", [], now) == []  # p5 has no spot offer
    assert where(candidates(catalog, EAST, big, "on_demand", [], now)) == [("us-east-1a", "p5.48xlarge", False)]


def test_gpu_type_filter_and_unknown_preferences(catalog, now):
    cs = candidates(catalog, ["aws", "gcp"], VariantNeeds(1, 16, ("l4",)), "on_demand", [], now)
    assert {c.instance_type for c in cs} == {"g2-standard-8"}
    assert candidates(catalog, ["local", "aws/eu-north-1"], ANY_24G, "on_demand", [], now) == []
    with pytest.raises(ValueError):
        candidates(catalog, EAST, ANY_24G, "cheap", [], now)  # type: ignore[arg-type]


def test_zone_preference_and_overlapping_preferences(catalog, now):
    cs = candidates(catalog, ["aws/us-east-1/us-east-1c", "aws/us-east-1"], L40S, "on_demand", [], now)
    assert [c.zone for c in cs[:4]] == ["us-east-1c", "us-east-1a", "us-east-1b", "us-east-1a"]
    assert len(cs) == len(set(cs))  # the overlap adds nothing twice


def test_avoid_zones_moves_the_preempted_zone_last(catalog, now):
    cs = candidates(catalog, EAST, L40S, "spot", [], now, avoid_zones=["us-east-1a"])
    assert [c.zone for c in cs] == ["us-east-1b", "us-east-1c", "us-east-1a"]


# -- blocks -------------------------------------------------------------------------


def first(catalog, now, prefs=EAST, needs=L40S, policy="spot_with_fallback", blocked=()):
    return candidates(catalog, prefs, needs, policy, list(blocked), now)


def test_capacity_in_zone_moves_to_next_zone_same_market(catalog, now):
    before = first(catalog, now)
    block = block_for(CapacityError("no capacity", code="InsufficientInstanceCapacity"), before[0], now)
    assert block.scope == "zone" and block.zone == "us-east-1a" and block.region == "us-east-1"
    assert block.expires_at == now + timedelta(minutes=10)
    after = first(catalog, now, blocked=[block])
    assert (after[0].zone, after[0].spot) == ("us-east-1b", True)
    # Spot capacity is a separate pool: on-demand in us-east-1a is still offered.
    assert ("us-east-1a", "g6e.xlarge", False) in where(after)
    assert ("us-east-1a", "g6e.xlarge", True) not in where(after)


def test_quota_moves_to_next_region(catalog, now):
    prefs = ["aws/us-east-1", "aws/us-west-2"]
    before = first(catalog, now, prefs=prefs, policy="on_demand")
    block = block_for(QuotaError("vCPU limit", code="VcpuLimitExceeded"), before[0], now)
    assert block.scope == "region" and block.zone is None
    after = first(catalog, now, prefs=prefs, policy="on_demand", blocked=[block])
    assert {c.region for c in after} == {"us-west-2"}


def test_gpus_all_regions_blocks_the_whole_cloud(catalog, now):
    prefs = ["gcp", "aws/us-east-1"]
    before = first(catalog, now, prefs=prefs, needs=ANY_24G)
    assert before[0].cloud == "gcp"
    err = QuotaError("Quota 'GPUS_ALL_REGIONS' exceeded", code="QUOTA_EXCEEDED", scope="cloud")
    block = block_for(err, before[0], now)
    assert (block.scope, block.region, block.spot) == ("cloud", None, None)
    after = first(catalog, now, prefs=prefs, needs=ANY_24G, blocked=[block])
    assert after and {c.cloud for c in after} == {"aws"}


def test_config_error_blocks_every_market_and_type(catalog, now):
    before = first(catalog, now, prefs=["aws"], needs=ANY_24G)
    block = block_for(ConfigError("AuthFailure", code="AuthFailure"), before[0], now)
    assert first(catalog, now, prefs=["aws"], needs=ANY_24G, blocked=[block]) == []
    regional = block_for(ConfigError("no template", code="InvalidLaunchTemplateId.NotFound", scope="region"), before[0], now)
    left = first(catalog, now, prefs=["aws"], needs=ANY_24G, blocked=[regional])
    assert {c.region for c in left} == {"us-west-2"}  # both markets of us-east-1 gone


def test_transient_errors_block_nothing(catalog, now):
    c = first(catalog, now)[0]
    assert block_for(TransientError("throttled", code="RequestLimitExceeded"), c, now) is None


def test_unknown_errors_block_the_zone(catalog, now):
    c = first(catalog, now)[0]
    block = block_for(ProviderError("???", code="Weird"), c, now)
    assert block.scope == "zone" and block.instance_type == c.instance_type


def test_expired_blocks_no_longer_apply(catalog, now):
    c = first(catalog, now)[0]
    block = block_for(CapacityError("full"), c, now - timedelta(hours=1), cooldown=timedelta(minutes=5))
    assert not block.active(now)
    assert first(catalog, now, blocked=[block])[0] == c
    fresh = block_for(CapacityError("full"), c, now, cooldown=timedelta(minutes=5))
    assert first(catalog, now, blocked=[fresh])[0] != c
    assert first(catalog, now + timedelta(minutes=6), blocked=[fresh])[0] == c


def test_blocks_from_another_cloud_do_not_leak(catalog, now):
    gcp_block = BlockEntry("cloud", "gcp", None, None, now + timedelta(hours=1), "auth")
    assert first(catalog, now, blocked=[gcp_block]) == first(catalog, now)


def test_preference_parsing():
    assert PlacementPreference.parse("aws") == PlacementPreference("aws")
    assert PlacementPreference.parse("gcp/us-central1/us-central1-a") == PlacementPreference(
        "gcp", "us-central1", "us-central1-a"
    )
    assert PlacementPreference.parse({"cloud": "aws", "region": "us-east-1"}).region == "us-east-1"


def test_blocks_are_per_region_even_with_same_zone_names(now):
    c = Candidate("aws", "us-east-1", "z", "t", False, 1.0, "lt")
    other = Candidate("aws", "us-west-2", "z", "t", False, 1.0, "lt")
    block = block_for(CapacityError("full"), c, now)
    assert block.covers(c) and not block.covers(other)


# -- properties -----------------------------------------------------------------------

ZONES = [("aws", "us-east-1", z) for z in ("us-east-1a", "us-east-1b", "us-east-1c")] + [
    ("aws", "us-west-2", "us-west-2a"),
    ("gcp", "us-central1", "us-central1-a"),
]


@settings(max_examples=60, deadline=None)
@given(
    picks=st.lists(
        st.tuples(
            st.sampled_from(["zone", "region", "cloud"]),
            st.sampled_from(ZONES),
            st.sampled_from([None, "g5.xlarge", "g6e.xlarge"]),
            st.sampled_from([None, True, False]),
            st.integers(min_value=-30, max_value=30),
        ),
        max_size=6,
    ),
    policy=st.sampled_from(["on_demand", "spot", "spot_with_fallback"]),
)
def test_blocking_only_removes_covered_candidates_and_keeps_order(picks, policy):
    catalog = load_catalog(catalog_dict())
    now = datetime(2026, 1, 1, tzinfo=UTC)
    blocks = [
        BlockEntry(scope, cloud, region, zone, now + timedelta(minutes=minutes), "test", itype, spot)
        for scope, (cloud, region, zone), itype, spot, minutes in picks
    ]
    prefs = ["aws", "gcp"]
    everything = candidates(catalog, prefs, ANY_24G, policy, [], now)
    kept = candidates(catalog, prefs, ANY_24G, policy, blocks, now)
    active = [b for b in blocks if b.active(now)]
    assert kept == [c for c in everything if not any(b.covers(c) for b in active)]
    if policy == "spot_with_fallback":
        # Within each cloud preference, no spot candidate comes after an on-demand one.
        for cloud in ("aws", "gcp"):
            markets = [c.spot for c in kept if c.cloud == cloud]
            assert markets == sorted(markets, reverse=True)
