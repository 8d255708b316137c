"""Where to launch next: candidate ordering and the failover blocklist (pure).

Nothing here does I/O. The control plane loads the blocklist rows (shared by all
workers, stored in the database) and the catalog, calls :func:`candidates`, tries them
in order through a provider, and turns each failure into a new row with
:func:`block_for`.

Ordering, from most to least significant:

1. placement preference (the pool's ordered list of cloud/region/zone choices);
2. market: with ``spot_with_fallback`` every spot candidate of a preference comes
   before its on-demand ones; ``spot`` and ``on_demand`` offer one market only;
3. hourly price, cheapest first;
4. catalog order of regions, zones and instance types (stable ties).

Zones in ``avoid_zones`` (where a spot node was just preempted) are moved to the end,
so the replacement lands elsewhere first but may still come back if nothing else fits.

Blocks are as narrow as the error allows. A capacity error blocks only the zone *for
that instance type and market* (spot and on-demand capacity are separate pools on
both clouds, so exhausting spot must not stop the on-demand fallback). A regional
quota error blocks the region for that market (quotas are per market); an all-regions
quota or a config error blocks every market.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from infra.catalog import Catalog
from infra.errors import ConfigError, ProviderError, Scope

SpotPolicy = Literal["on_demand", "spot", "spot_with_fallback"]
SPOT_POLICIES: tuple[SpotPolicy, ...] = ("on_demand", "spot", "spot_with_fallback")


@dataclass(frozen=True)
class PlacementPreference:
    """One entry of a pool's placement list; ``None`` fields mean "any"."""

    cloud: str
    region: str | None = None
    zone: str | None = None

    @classmethod
    def parse(cls, value: PlacementPreference | Mapping[str, Any] | str) -> PlacementPreference:
        """Accepts the object, a dict, or ``"cloud[/region[/zone]]"``."""
        if isinstance(value, PlacementPreference):
            return value
        if isinstance(value, str):
            parts = value.split("/")
            return cls(*(p or None for p in parts[:3]))  # type: ignore[arg-type]
        return cls(cloud=value["cloud"], region=value.get("region"), zone=value.get("zone"))


@dataclass(frozen=True)
class VariantNeeds:
    """What one replica of a model variant needs from a node."""

    gpu_count: int
    gpu_memory_gb: float  # per GPU
    gpu_types: tuple[str, ...] = ()  # empty: any accelerator


@dataclass(frozen=True)
class Candidate:
    cloud: str
    region: str
    zone: str
    instance_type: str
    spot: bool
    price: float  # USD per instance-hour in this market
    template_id: str
    subnet: str | None = None


@dataclass(frozen=True)
class BlockEntry:
    """A row of the shared failover blocklist.

    ``region``/``zone`` are ``None`` above their scope. ``instance_type`` and ``spot``
    narrow a block further when not ``None`` (see the module docstring).
    """

    scope: Scope
    cloud: str
    region: str | None
    zone: str | None
    expires_at: datetime
    reason: str
    instance_type: str | None = None
    spot: bool | None = None

    def active(self, now: datetime) -> bool:
        return self.expires_at > now

    def covers(self, c: Candidate) -> bool:
        if c.cloud != self.cloud:
            return False
        if self.instance_type is not None and c.instance_type != self.instance_type:
            return False
        if self.spot is not None and c.spot != self.spot:
            return False
        match self.scope:
            case "cloud":
                return True
            case "region":
                return c.region == self.region
            case "zone":
                return c.region == self.region and c.zone == self.zone
        return False


DEFAULT_COOLDOWNS: Mapping[Scope, timedelta] = {
    "zone": timedelta(minutes=10),
    "region": timedelta(minutes=30),
    "cloud": timedelta(hours=1),
}


def fits(gpu_type: str, gpu_count: int, gpu_memory_gb: float, needs: VariantNeeds) -> bool:
    return (
        gpu_count >= needs.gpu_count
        and gpu_memory_gb >= needs.gpu_memory_gb
        and (not needs.gpu_types or gpu_type in needs.gpu_types)
    )


def _markets(policy: SpotPolicy) -> tuple[bool, ...]:
    if policy not in SPOT_POLICIES:
        raise ValueError(f"unknown spot policy {policy!r}")
    return {"on_demand": (False,), "spot": (True,), "spot_with_fallback": (True, False)}[policy]


def _expand(catalog: Catalog, pref: PlacementPreference, needs: VariantNeeds, spot: bool) -> list[Candidate]:
    cloud = catalog.cloud(pref.cloud)
    if cloud is None:
        return []
    found: list[Candidate] = []
    for region in cloud.regions:
        if pref.region is not None and region.name != pref.region:
            continue
        for zone in region.zones:
            if pref.zone is not None and zone.name != pref.zone:
                continue
            for it in region.instance_types:
                price = it.spot_price if spot else it.on_demand_price
                if price is None or not it.offered_in(zone.name):
                    continue
                if not fits(it.gpu_type, it.gpu_count, it.gpu_memory_gb, needs):
                    continue
                found.append(
                    Candidate(cloud.name, region.name, zone.name, it.name, spot, price, region.template.id, zone.subnet)
                )
    # sorted() is stable: equal prices keep catalog order (region, zone, type).
    return sorted(found, key=lambda c: c.price)


def candidates(
    catalog: Catalog,
    placement_prefs: Sequence[PlacementPreference | Mapping[str, Any] | str],
    variant_needs: VariantNeeds,
    spot_policy: SpotPolicy,
    blocked: Iterable[BlockEntry],
    now: datetime,
    avoid_zones: Iterable[str] = (),
) -> list[Candidate]:
    """Every launchable (cloud, region, zone, type, market), best first, minus blocks."""
    active = [b for b in blocked if b.active(now)]
    ordered: list[Candidate] = []
    seen: set[Candidate] = set()
    for raw in placement_prefs:
        pref = PlacementPreference.parse(raw)
        for spot in _markets(spot_policy):
            for c in _expand(catalog, pref, variant_needs, spot):
                # Overlapping preferences ("gcp" after "gcp/us-central1") add nothing twice.
                if c not in seen and not any(b.covers(c) for b in active):
                    seen.add(c)
                    ordered.append(c)
    avoid = set(avoid_zones)
    return [c for c in ordered if c.zone not in avoid] + [c for c in ordered if c.zone in avoid]


def block_for(
    error: ProviderError,
    candidate: Candidate,
    now: datetime,
    cooldown: timedelta | Mapping[Scope, timedelta] = DEFAULT_COOLDOWNS,
) -> BlockEntry | None:
    """The blocklist row a failed launch on ``candidate`` should create, if any."""
    scope = error.scope
    if scope == "none":
        return None
    ttl = cooldown if isinstance(cooldown, timedelta) else cooldown[scope]
    reason = f"{error.code or type(error).__name__}: {error.message}"[:500]
    # Config errors (credentials, templates, subnets) break every market and type alike.
    narrow = not isinstance(error, ConfigError)
    spot = candidate.spot if narrow and scope != "cloud" else None
    instance_type = candidate.instance_type if narrow and scope == "zone" else None
    region = candidate.region if scope in ("zone", "region") else None
    zone = candidate.zone if scope == "zone" else None
    return BlockEntry(scope, candidate.cloud, region, zone, now + ttl, reason, instance_type, spot)
