"""The cloud catalog: what Terraform built and what Nimbus may launch into.

:func:`load_catalog` validates the JSON against ``schema.json`` (the shared format;
Terraform emits it, ``nimbus catalog import`` reads it) and returns frozen, typed
objects that :mod:`infra.placement` walks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_PATH = Path(__file__).with_name("schema.json")


class CatalogError(ValueError):
    """The catalog does not match the schema (the message names the failing path)."""


@dataclass(frozen=True)
class Template:
    kind: str
    id: str
    name: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class Zone:
    name: str
    subnet: str | None = None


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpu_type: str
    gpu_count: int
    gpu_memory_gb: float
    on_demand_price: float
    spot_price: float | None = None
    vcpus: int | None = None
    memory_gb: float | None = None
    zones: tuple[str, ...] | None = None  # None: every zone of the region

    def offered_in(self, zone: str) -> bool:
        return self.zones is None or zone in self.zones


@dataclass(frozen=True)
class Region:
    name: str
    template: Template
    zones: tuple[Zone, ...]
    instance_types: tuple[InstanceType, ...]
    edge_url: str | None = None
    artifact_bucket: str | None = None


@dataclass(frozen=True)
class Cloud:
    name: str
    regions: tuple[Region, ...]
    project: str | None = None


@dataclass(frozen=True)
class Catalog:
    clouds: tuple[Cloud, ...]
    version: int = 1
    generated_by: str | None = None

    def cloud(self, name: str) -> Cloud | None:
        return next((c for c in self.clouds if c.name == name), None)


@cache
def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate(data: Mapping[str, Any]) -> None:
    errors = sorted(_validator().iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "<root>"
        raise CatalogError(f"catalog invalid at {where}: {first.message}")


def load_catalog(source: str | Path | Mapping[str, Any]) -> Catalog:
    """Parse and validate a catalog from a file path, a JSON string or a parsed dict."""
    if isinstance(source, Mapping):
        data = source
    elif isinstance(source, Path) or not str(source).lstrip().startswith("{"):
        data = json.loads(Path(source).read_text())
    else:
        data = json.loads(source)
    validate(data)
    return Catalog(
        clouds=tuple(_cloud(c) for c in data["clouds"]),
        version=data["version"],
        generated_by=data.get("generated_by"),
    )


def _cloud(data: Mapping[str, Any]) -> Cloud:
    return Cloud(name=data["name"], project=data.get("project"), regions=tuple(_region(r) for r in data["regions"]))


def _region(data: Mapping[str, Any]) -> Region:
    return Region(
        name=data["name"],
        template=Template(**data["template"]),
        zones=tuple(Zone(**z) for z in data["zones"]),
        instance_types=tuple(_instance_type(t) for t in data["instance_types"]),
        edge_url=data.get("edge_url"),
        artifact_bucket=data.get("artifact_bucket"),
    )


def _instance_type(data: Mapping[str, Any]) -> InstanceType:
    fields = dict(data)
    if "zones" in fields:
        fields["zones"] = tuple(fields["zones"])
    return InstanceType(**fields)
