"""Cloud catalog import: Terraform's `cloud_catalog` output becomes clouds/regions/zones/types rows.

The file is validated against the one JSON schema both sides share (infra/catalog/schema.json).
An import is authoritative for every cloud it names: regions of that cloud missing from the
file are removed, everything else is upserted by name, so re-importing is idempotent.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from controlplane.models import Cloud, InstanceType, Region, Zone
from controlplane.schemas.catalog import CatalogImportResult, InstanceTypeOut, RegionOut, ZoneOut
from controlplane.services.errors import FieldError, Invalid

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "infra" / "catalog" / "schema.json"


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    return jsonschema.Draft202012Validator(schema)


def validate(doc: Any) -> None:
    errors = sorted(_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        raise Invalid(
            "catalog does not match the cloud catalog schema",
            [FieldError("/".join(str(p) for p in e.absolute_path) or "$", e.message) for e in errors[:50]],
        )


def import_catalog(session: Session, doc: Any) -> CatalogImportResult:
    """Synchronous on purpose: used by the CLI, by Celery and (via run_sync) by the API."""
    validate(doc)
    counts = {"regions": 0, "zones": 0, "instance_types": 0}
    removed: list[str] = []
    for cloud_doc in doc["clouds"]:
        cloud = session.scalar(
            select(Cloud).where(Cloud.name == cloud_doc["name"]).options(
                selectinload(Cloud.regions).selectinload(Region.zones),
                selectinload(Cloud.regions).selectinload(Region.instance_types),
            )
        )
        if cloud is None:
            cloud = Cloud(name=cloud_doc["name"], regions=[])
            session.add(cloud)
        cloud.project = cloud_doc.get("project")
        existing = {r.name: r for r in cloud.regions}
        wanted = {r["name"] for r in cloud_doc["regions"]}
        for name, region in existing.items():
            if name not in wanted:
                cloud.regions.remove(region)
                removed.append(f"{cloud.name}/{name}")
        for region_doc in cloud_doc["regions"]:
            region = existing.get(region_doc["name"])
            if region is None:
                region = Region(name=region_doc["name"], zones=[], instance_types=[])
                cloud.regions.append(region)
            _apply_region(region, region_doc)
            counts["regions"] += 1
            counts["zones"] += len(region_doc["zones"])
            counts["instance_types"] += len(region_doc["instance_types"])
    session.flush()
    return CatalogImportResult(clouds=len(doc["clouds"]), removed_regions=removed, **counts)


def _apply_region(region: Region, doc: dict) -> None:
    tpl = doc["template"]
    region.edge_url = doc.get("edge_url")
    region.artifact_bucket = doc.get("artifact_bucket")
    region.template_kind = tpl["kind"]
    region.template_id = tpl["id"]
    region.template_name = tpl.get("name")
    region.template_version = tpl.get("version")
    _sync_children(region.zones, doc["zones"], Zone, ("subnet",))
    _sync_children(
        region.instance_types,
        doc["instance_types"],
        InstanceType,
        ("gpu_type", "gpu_count", "gpu_memory_gb", "vcpus", "memory_gb", "on_demand_price", "spot_price", "zones"),
    )


def _sync_children(rows: list, docs: list[dict], model: type, fields: tuple[str, ...]) -> None:
    by_name = {r.name: r for r in rows}
    wanted = {d["name"] for d in docs}
    for name, row in by_name.items():
        if name not in wanted:
            rows.remove(row)
    for d in docs:
        row = by_name.get(d["name"])
        if row is None:
            row = model(name=d["name"])
            rows.append(row)
        for f in fields:
            setattr(row, f, d.get(f))


def list_regions(session: Session) -> list[RegionOut]:
    regions = session.scalars(
        select(Region).options(
            selectinload(Region.cloud), selectinload(Region.zones), selectinload(Region.instance_types)
        )
    ).all()
    return sorted(
        (
            RegionOut(
                cloud=r.cloud.name,
                name=r.name,
                edge_url=r.edge_url,
                artifact_bucket=r.artifact_bucket,
                template_kind=r.template_kind,
                template_id=r.template_id,
                zones=[msgspec.convert(z, ZoneOut, from_attributes=True) for z in r.zones],
                instance_types=[msgspec.convert(t, InstanceTypeOut, from_attributes=True) for t in r.instance_types],
            )
            for r in regions
        ),
        key=lambda r: (r.cloud, r.name),
    )
