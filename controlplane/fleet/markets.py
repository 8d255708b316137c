"""Which market new capacity goes to: the spot / on-demand split of a pool's replicas. Pure.

The autoscaler decides how many replicas a pool needs; the fleet decides where they run, and
this module is the market half of that: how many of the pool's target should be spot and how
many on-demand, and whether spot can be launched at all right now.

* ``split_by_capacity_type``  the mix for a pool's target under its capacity policy, with an
  on-demand base that a spot reclaim cannot take away, on-demand only when spot is not cheaper,
  and on-demand fallback for the spot replicas that are not ready while spot is out
  (SkyServe's dynamic fallback). When spot returns, the mix asks for spot again; the stand-ins
  are stopped only once the spot replicas are ready (make-before-break, the fleet's job).
* ``spot_available``          spot may be launched (no active capacity block says otherwise).
* ``spot_unavailable_until``  until when spot counts as out for a pool: while every region of
  its placement list has an active spot block.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ON_DEMAND, SPOT, SPOT_WITH_FALLBACK = "on_demand", "spot", "spot_with_fallback"


@dataclass(frozen=True)
class CapacityMix:
    spot: int
    on_demand: int
    reason: str | None = None  # why the mix differs from what the policy alone would ask for

    @property
    def total(self) -> int:
        return self.spot + self.on_demand


def _epoch(t: float | dt.datetime) -> float:
    return t.timestamp() if isinstance(t, dt.datetime) else float(t)


def spot_available(spot_unavailable_until: float | dt.datetime | None, now: float | dt.datetime) -> bool:
    return spot_unavailable_until is None or _epoch(spot_unavailable_until) <= _epoch(now)


def split_by_capacity_type(policy: str, base_on_demand: int, target: int, *, spot_price: float | None,
                           on_demand_price: float | None, spot_unavailable_until: float | dt.datetime | None,
                           now: float | dt.datetime, ready_spot: int) -> CapacityMix:
    """How many of ``target`` replicas should be spot and how many on-demand.

    ``policy`` is the pool's ``spot_policy`` (``on_demand``, ``spot``, ``spot_with_fallback``; an
    enum whose ``value`` is one of those works too). ``base_on_demand`` replicas stay on-demand
    under ``spot_with_fallback``. ``ready_spot`` counts the pool's spot replicas that are ready:
    while spot is out they are kept, and only the rest of the spot share falls back to on-demand.

    A pure ``spot`` pool stays all spot during an outage: it has no fallback, so the fleet
    launches nothing for it until ``spot_available`` says spot is back."""
    policy = getattr(policy, "value", policy)
    target = max(0, target)
    if policy == ON_DEMAND:
        return CapacityMix(0, target)
    if policy == SPOT:
        return CapacityMix(target, 0)
    if policy != SPOT_WITH_FALLBACK:
        raise ValueError(f"unknown spot policy {policy!r}")
    base = min(max(0, base_on_demand), target)
    wanted_spot = target - base
    if spot_price is not None and on_demand_price is not None and spot_price >= on_demand_price:
        # Spot's only point is price; at parity its preemptions buy nothing.
        return CapacityMix(0, target, "spot not cheaper than on-demand: on-demand only")
    if spot_available(spot_unavailable_until, now):
        return CapacityMix(wanted_spot, base)
    keep_spot = min(wanted_spot, max(0, ready_spot))
    return CapacityMix(keep_spot, target - keep_spot, "spot unavailable: on-demand fallback")


def _pref(entry: Mapping[str, Any] | Any) -> tuple[str, str | None]:
    """(cloud, region) of a placement entry: a pool's JSON placement item or a ``PlacementPref``."""
    if isinstance(entry, Mapping):
        return entry["cloud"], entry.get("region")
    return entry.cloud, entry.region


def spot_unavailable_until(blocks: Iterable[tuple[str, str | None, float | dt.datetime]],
                           placement: Iterable[Mapping[str, Any] | Any],
                           now: float | dt.datetime) -> float | None:
    """Epoch seconds until which spot counts as unavailable for a pool, or None when it is available.

    ``blocks`` are the active spot capacity blocks as ``(cloud, region, expires_at)``; a region of
    None blocks the whole cloud. Rows that expired by ``now`` are ignored, so the caller may pass
    them unfiltered. ``placement`` is the pool's ordered placement list (``{"cloud", "region"}``
    dicts or ``PlacementPref``s); an entry without a region is covered only by a cloud-wide block.

    Spot is out while every placement region is blocked, until the first of those blocks ends; a
    region blocked both on its own and cloud-wide stays blocked until the later one ends. Zone- and
    type-level blocks count for their whole region: the launcher's own failover walks the zones,
    this only tells the fleet to plan on-demand for a while."""
    t = _epoch(now)
    regions = {_pref(p) for p in placement}
    if not regions:
        return None
    by_region: dict[tuple[str, str | None], float] = {}
    for cloud, region, expires_at in blocks:
        end = _epoch(expires_at)
        if end > t:
            key = (cloud, region)
            by_region[key] = max(end, by_region.get(key, end))
    ends = []
    for cloud, region in regions:
        covering = [by_region.get((cloud, None))]
        if region is not None:
            covering.append(by_region.get((cloud, region)))
        known = [end for end in covering if end is not None]
        if not known:
            return None
        ends.append(max(known))
    return min(ends)
