"""Launchable shapes for the bench: the multicloud sample catalog, or a fine-grained variant.

``sample`` is ``terraform/environments/multicloud/catalog.sample.json`` as it is. ``fine`` adds,
for every GPU type of every region there, 1-, 2-, 4- and 8-GPU shapes priced per GPU like the
sample's shape of that type in that region (spot too, where the sample has a spot price), so a
1-GPU model never has to buy an 8-GPU VM.

The bench runs every contender on on-demand capacity only: spot preemptions are not modelled,
and a spot price without them would only flatter whoever uses more spot.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from controlplane.fleet.capacity import Offer
from infra.catalog import load_catalog

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "terraform" / "environments" / "multicloud" / "catalog.sample.json"
FINE_SIZES = (1, 2, 4, 8)


def sample_offers(path: Path = SAMPLE, *, spot: bool = False) -> list[Offer]:
    catalog = load_catalog(path)
    offers = []
    for cloud in catalog.clouds:
        for region in cloud.regions:
            region_zones = tuple(z.name for z in region.zones)
            for it in region.instance_types:
                zones = tuple(it.zones) if it.zones else region_zones
                markets = [(False, it.on_demand_price)]
                if spot and it.spot_price is not None:
                    markets.append((True, it.spot_price))
                for is_spot, price in markets:
                    offers.append(Offer(cloud.name, region.name, it.name, it.gpu_type, it.gpu_count,
                                        it.gpu_memory_gb, is_spot, price, zones))
    return offers


def fine_offers(path: Path = SAMPLE, *, spot: bool = False) -> list[Offer]:
    """Every (cloud, region, GPU type, market) of the sample in 1/2/4/8-GPU shapes at the sample's
    per-GPU price; the sample's own shapes keep their names."""
    out: list[Offer] = []
    seen: set[tuple] = set()
    for o in sample_offers(path, spot=spot):
        key = (o.cloud, o.region, o.gpu_type, o.spot)
        if key in seen:
            continue
        seen.add(key)
        for n in FINE_SIZES:
            name = o.instance_type if n == o.gpu_count else f"{o.instance_type}~{o.gpu_type}x{n}"
            out.append(replace(o, instance_type=name, gpu_count=n, price_per_hour=o.price_per_gpu_hour * n))
    return out


def offers_for(name: str, *, spot: bool = False) -> list[Offer]:
    if name == "sample":
        return sample_offers(spot=spot)
    if name == "fine":
        return fine_offers(spot=spot)
    raise ValueError(f"unknown catalog {name!r} (sample, fine)")
