"""The imported cloud catalog as ``infra.catalog.Catalog``, the shape placement walks.

Also turns a pool's placement list (``{cloud, region, zones?}``) into infra's
``PlacementPreference`` entries and a variant into ``VariantNeeds``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from controlplane.fleet.capacity import Offer, PlacementPref
from controlplane.models import Cloud, ModelVariant, Region
from infra import catalog as ic
from infra.placement import BlockEntry, Candidate, PlacementPreference, VariantNeeds


def load(session: Session) -> ic.Catalog:
    """Four statements whatever the catalog's size (clouds, regions, zones, types)."""
    clouds = session.scalars(
        select(Cloud)
        .order_by(Cloud.name)
        .options(
            selectinload(Cloud.regions).selectinload(Region.zones),
            selectinload(Cloud.regions).selectinload(Region.instance_types),
        )
    ).all()
    return ic.Catalog(clouds=tuple(_cloud(c) for c in clouds))


def _cloud(c: Cloud) -> ic.Cloud:
    return ic.Cloud(name=c.name, project=c.project, regions=tuple(_region(r) for r in c.regions))


def _region(r: Region) -> ic.Region:
    return ic.Region(
        name=r.name,
        template=ic.Template(kind=r.template_kind, id=r.template_id, name=r.template_name, version=r.template_version),
        zones=tuple(ic.Zone(name=z.name, subnet=z.subnet) for z in r.zones),
        instance_types=tuple(
            ic.InstanceType(
                name=t.name,
                gpu_type=t.gpu_type,
                gpu_count=t.gpu_count,
                gpu_memory_gb=t.gpu_memory_gb,
                on_demand_price=t.on_demand_price,
                spot_price=t.spot_price,
                vcpus=t.vcpus,
                memory_gb=t.memory_gb,
                zones=tuple(t.zones) if t.zones is not None else None,
            )
            for t in r.instance_types
        ),
        edge_url=r.edge_url,
        artifact_bucket=r.artifact_bucket,
    )


def preferences(placement: Iterable[Mapping[str, Any]]) -> list[PlacementPreference]:
    """A pool entry listing several zones becomes one preference per zone, in order."""
    prefs: list[PlacementPreference] = []
    for entry in placement:
        zones = entry.get("zones") or [None]
        prefs.extend(PlacementPreference(entry["cloud"], entry.get("region"), zone) for zone in zones)
    return prefs


def regions_of(catalog: ic.Catalog, placement: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Every (cloud, region) a pool may launch into: where to look for its VMs."""
    found: list[tuple[str, str]] = []
    for pref in preferences(placement):
        cloud = catalog.cloud(pref.cloud)
        for region in cloud.regions if cloud else ():
            if pref.region in (None, region.name) and (pref.cloud, region.name) not in found:
                found.append((pref.cloud, region.name))
    return found


def all_regions(catalog: ic.Catalog) -> list[tuple[str, str]]:
    return [(c.name, r.name) for c in catalog.clouds for r in c.regions]


def needs(variant: ModelVariant) -> VariantNeeds:
    return VariantNeeds(
        gpu_count=variant.gpu_count,
        gpu_memory_gb=variant.gpu_memory_gb,
        gpu_types=tuple(variant.gpu_types or ()),
    )


def gpus_of(catalog: ic.Catalog, cloud: str, region: str, instance_type: str) -> int:
    c = catalog.cloud(cloud)
    for r in c.regions if c else ():
        if r.name == region:
            for t in r.instance_types:
                if t.name == instance_type:
                    return t.gpu_count
    return 0


def offers(catalog: ic.Catalog, blocks: Iterable[BlockEntry], now: dt.datetime) -> list[Offer]:
    """Every (cloud, region, instance type, market) with a price, and the zones it may launch in
    now: a zone that an active block covers for that type and market is left out."""
    active = [b for b in blocks if b.active(now)]
    found: list[Offer] = []
    for cloud in catalog.clouds:
        for region in cloud.regions:
            for it in region.instance_types:
                for spot, price in ((False, it.on_demand_price), (True, it.spot_price)):
                    if price is None:
                        continue
                    zones = tuple(
                        z.name for z in region.zones
                        if it.offered_in(z.name) and not any(
                            b.covers(Candidate(cloud.name, region.name, z.name, it.name, spot, price,
                                               region.template.id, z.subnet)) for b in active)
                    )
                    found.append(Offer(cloud.name, region.name, it.name, it.gpu_type, it.gpu_count,
                                       it.gpu_memory_gb, spot, price, zones))
    return found


def placement_prefs(placement: Iterable[Mapping[str, Any]]) -> tuple[PlacementPref, ...]:
    return tuple(PlacementPref(p["cloud"], p.get("region"), tuple(p.get("zones") or ())) for p in placement)


@dataclass(frozen=True)
class Shape:
    gpu_type: str
    gpu_memory_gb: float
    on_demand_price: float
    spot_price: float | None

    def price(self, spot: bool) -> float:
        return float((self.spot_price if spot else self.on_demand_price) or 0.0)


Shapes = Mapping[tuple[str | None, str | None, str | None], Shape]


def shapes(catalog: ic.Catalog) -> dict[tuple[str, str, str], Shape]:
    """(cloud, region, instance type) → its GPUs and prices."""
    return {(c.name, r.name, t.name): Shape(t.gpu_type, t.gpu_memory_gb, t.on_demand_price, t.spot_price)
            for c in catalog.clouds for r in c.regions for t in r.instance_types}
