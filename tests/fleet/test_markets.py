"""The spot / on-demand split and the spot-outage signal (``controlplane.fleet.markets``)."""

from __future__ import annotations

import datetime as dt

import pytest

from controlplane.fleet.markets import (
    CapacityMix,
    split_by_capacity_type,
    spot_available,
    spot_unavailable_until,
)


def split(policy: str, target: int, *, base: int = 0, spot_price: float | None = None,
          on_demand_price: float | None = None, until: float | None = None, now: float = 0.0,
          ready_spot: int = 0) -> CapacityMix:
    return split_by_capacity_type(policy, base, target, spot_price=spot_price, on_demand_price=on_demand_price,
                                  spot_unavailable_until=until, now=now, ready_spot=ready_spot)


def test_on_demand_and_pure_spot_policies():
    assert split("on_demand", 5) == CapacityMix(0, 5)
    assert split("spot", 5) == CapacityMix(5, 0)
    # A pure spot pool has no fallback: the mix stays spot while spot is out, and
    # spot_available tells the fleet not to launch until the block ends.
    assert split("spot", 5, until=60.0, now=0.0) == CapacityMix(5, 0)
    assert not spot_available(60.0, 0.0)
    assert spot_available(60.0, 61.0) and spot_available(60.0, 60.0) and spot_available(None, 0.0)


def test_spot_mix_keeps_an_on_demand_base():
    # A single replica is the on-demand base; growing, the base stays one and the rest is spot.
    assert split("spot_with_fallback", 1, base=1) == CapacityMix(0, 1)
    assert split("spot_with_fallback", 6, base=1) == CapacityMix(5, 1)
    assert split("spot_with_fallback", 0, base=1) == CapacityMix(0, 0)
    assert split("spot_with_fallback", 4, base=0) == CapacityMix(4, 0)


def test_spot_outage_falls_back_to_on_demand_then_returns_to_spot():
    # 4 wanted (3 spot + 1 on-demand base); one spot replica survived the reclaim.
    outage = split("spot_with_fallback", 4, base=1, until=900.0, now=0.0, ready_spot=1)
    assert (outage.spot, outage.on_demand) == (1, 3)  # the survivor stays, two stand-ins on-demand
    assert outage.reason == "spot unavailable: on-demand fallback"
    # More ready spot than the spot share: only the share is kept.
    assert split("spot_with_fallback", 4, base=1, until=900.0, ready_spot=7) == CapacityMix(
        3, 1, "spot unavailable: on-demand fallback")
    # Spot is back: the mix asks for spot again (the fleet stops the stand-ins once those are ready).
    assert split("spot_with_fallback", 4, base=1, until=900.0, now=1000.0, ready_spot=1) == CapacityMix(3, 1)


def test_fallback_pool_uses_on_demand_when_spot_is_not_cheaper():
    cheap = split("spot_with_fallback", 3, spot_price=1.0, on_demand_price=3.0)
    parity = split("spot_with_fallback", 3, spot_price=3.0, on_demand_price=3.0)
    assert cheap == CapacityMix(3, 0)
    assert parity == CapacityMix(0, 3, "spot not cheaper than on-demand: on-demand only")
    # One price unknown: no comparison, the policy decides.
    assert split("spot_with_fallback", 3, spot_price=5.0) == CapacityMix(3, 0)


def test_enum_policies_and_unknown_ones():
    from controlplane.models import SpotPolicy

    assert split_by_capacity_type(SpotPolicy.spot_with_fallback, 1, 3, spot_price=None, on_demand_price=None,
                                  spot_unavailable_until=None, now=0.0, ready_spot=0) == CapacityMix(2, 1)
    with pytest.raises(ValueError):
        split("sometimes", 3)


T = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
PLACEMENT = [{"cloud": "aws", "region": "us-east-1"}, {"cloud": "gcp", "region": "us-central1"}]


def at(minutes: float) -> dt.datetime:
    return T + dt.timedelta(minutes=minutes)


def test_spot_is_out_only_while_every_placement_region_is_blocked():
    one = [("aws", "us-east-1", at(10))]
    assert spot_unavailable_until(one, PLACEMENT, T) is None  # gcp still has spot
    both = [*one, ("gcp", "us-central1", at(5))]
    assert spot_unavailable_until(both, PLACEMENT, T) == at(5).timestamp()  # until the first one ends
    # Expired rows are ignored; epoch floats work as well as datetimes.
    assert spot_unavailable_until(both, PLACEMENT, at(6)) is None
    floats = [(c, r, e.timestamp()) for c, r, e in both]
    assert spot_unavailable_until(floats, PLACEMENT, T.timestamp()) == at(5).timestamp()
    # No placement: nothing to say.
    assert spot_unavailable_until(both, [], T) is None


def test_cloud_wide_blocks_and_several_rows_per_region():
    # A cloud-wide block (region None) covers every region of that cloud...
    rows = [("aws", None, at(20)), ("gcp", "us-central1", at(8)), ("gcp", "us-central1", at(12))]
    assert spot_unavailable_until(rows, PLACEMENT, T) == at(12).timestamp()  # the later gcp row counts
    # ...and a region blocked on its own and cloud-wide stays out until the later of the two.
    rows = [("aws", "us-east-1", at(3)), ("aws", None, at(30)), ("gcp", None, at(40))]
    assert spot_unavailable_until(rows, PLACEMENT, T) == at(30).timestamp()
    # A placement entry with no region ("anywhere in the cloud") is covered only cloud-wide.
    anywhere = [{"cloud": "aws"}]
    assert spot_unavailable_until([("aws", "us-east-1", at(9))], anywhere, T) is None
    assert spot_unavailable_until([("aws", None, at(9))], anywhere, T) == at(9).timestamp()


def test_placement_prefs_from_the_capacity_model():
    from controlplane.fleet.capacity import PlacementPref as Pref

    prefs = [Pref("aws", "us-east-1"), Pref("gcp", "us-central1", zones=("us-central1-a",))]
    rows = [("aws", "us-east-1", at(4)), ("gcp", "us-central1", at(7))]
    assert spot_unavailable_until(rows, prefs, T) == at(4).timestamp()
