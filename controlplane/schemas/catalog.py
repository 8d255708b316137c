from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any

import msgspec

from controlplane.schemas.common import Name, Text200

Tier = Annotated[str, msgspec.Meta(min_length=1, max_length=16, pattern=r"^[a-z0-9_]+$")]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class CatalogImportResult(msgspec.Struct):
    clouds: int
    regions: int
    zones: int
    instance_types: int
    removed_regions: list[str]


class InstanceTypeOut(msgspec.Struct):
    name: str
    gpu_type: str
    gpu_count: int
    gpu_memory_gb: float
    on_demand_price: float
    spot_price: float | None
    vcpus: int | None
    memory_gb: float | None
    zones: list[str] | None


class ZoneOut(msgspec.Struct):
    name: str
    subnet: str | None


class RegionOut(msgspec.Struct):
    cloud: str
    name: str
    edge_url: str | None
    artifact_bucket: str | None
    template_kind: str
    template_id: str
    zones: list[ZoneOut]
    instance_types: list[InstanceTypeOut]


GpuType = Annotated[str, msgspec.Meta(min_length=1, max_length=32)]
# A generated token costs a replica from a fraction of a prompt token to a few dozen of them.
OutputTokenWeight = Annotated[float, msgspec.Meta(ge=0.1, le=100)]


class VariantCreate(msgspec.Struct, forbid_unknown_fields=True):
    tier: Tier
    model_path: Annotated[str, msgspec.Meta(min_length=1, max_length=500)]
    gpu_memory_gb: Annotated[float, msgspec.Meta(gt=0, le=4096)]
    context_length: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)]
    gpu_count: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    quantization: Annotated[str, msgspec.Meta(min_length=1, max_length=32)] | None = None
    engine_args: dict[str, Any] = {}
    gpu_types: list[Annotated[str, msgspec.Meta(min_length=1, max_length=32)]] | None = None
    size_gb: Annotated[float, msgspec.Meta(gt=0, le=100_000)] | None = None
    # One replica's measured throughput per GPU type inside the SLO, in weighted tokens/s
    # (prompt + output_token_weight × generated), e.g. {"h100": 9100}.
    profiled_tokens_per_s: dict[GpuType, Annotated[float, msgspec.Meta(gt=0, le=10_000_000)]] = {}
    # What one generated token costs a replica in prompt tokens (same profile); None: 1.
    output_token_weight: OutputTokenWeight | None = None


class VariantUpdate(msgspec.Struct, forbid_unknown_fields=True):
    model_path: Annotated[str, msgspec.Meta(min_length=1, max_length=500)] | None = None
    gpu_memory_gb: Annotated[float, msgspec.Meta(gt=0, le=4096)] | None = None
    context_length: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] | None = None
    gpu_count: Annotated[int, msgspec.Meta(ge=1, le=64)] | None = None
    quantization: Annotated[str, msgspec.Meta(min_length=1, max_length=32)] | None = None
    engine_args: dict[str, Any] | None = None
    size_gb: Annotated[float, msgspec.Meta(gt=0, le=100_000)] | None = None
    profiled_tokens_per_s: dict[GpuType, Annotated[float, msgspec.Meta(gt=0, le=10_000_000)]] | None = None
    output_token_weight: OutputTokenWeight | None = None


class VariantOut(msgspec.Struct):
    id: uuid.UUID
    model_id: uuid.UUID
    model: str
    tier: str
    quantization: str | None
    model_path: str
    engine_args: dict[str, Any]
    gpu_count: int
    gpu_memory_gb: float
    gpu_types: list[str] | None
    context_length: int
    size_gb: float | None
    created_at: dt.datetime
    profiled_tokens_per_s: dict[str, float] = {}
    output_token_weight: float | None = None


class ModelCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: ModelName
    display_name: Text200 = ""
    description: Annotated[str, msgspec.Meta(max_length=2000)] = ""
    default_tier: Tier | None = None
    variants: list[VariantCreate] = []


class ModelUpdate(msgspec.Struct, forbid_unknown_fields=True):
    display_name: Text200 | None = None
    description: Annotated[str, msgspec.Meta(max_length=2000)] | None = None
    default_tier: Tier | None = None


class ModelOut(msgspec.Struct):
    id: uuid.UUID
    name: str
    display_name: str
    description: str
    default_tier: str | None
    variants: list[VariantOut]
    created_at: dt.datetime


__all__ = ["Name"]
