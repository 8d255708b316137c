"""Cloud catalog imported from Terraform's output, and the models Nimbus serves."""

from __future__ import annotations

import uuid

from sqlalchemy import CheckConstraint, Float, ForeignKey, Integer, String, UniqueConstraint, Uuid
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controlplane.db.base import Base, Timestamps, UUIDPrimaryKey
from controlplane.db.types import JSONType


class Cloud(UUIDPrimaryKey, Timestamps, Base):
    __tablename__ = "clouds"

    name: Mapped[str] = mapped_column(String(16), unique=True)
    project: Mapped[str | None] = mapped_column(String(200))

    regions: Mapped[list[Region]] = relationship(
        back_populates="cloud", cascade="all, delete-orphan", order_by="Region.name"
    )


class Region(UUIDPrimaryKey, Timestamps, Base):
    __tablename__ = "regions"

    cloud_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("clouds.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    edge_url: Mapped[str | None] = mapped_column(String(500))
    artifact_bucket: Mapped[str | None] = mapped_column(String(500))
    template_kind: Mapped[str] = mapped_column(String(32))
    template_id: Mapped[str] = mapped_column(String(500))
    template_name: Mapped[str | None] = mapped_column(String(200))
    template_version: Mapped[str | None] = mapped_column(String(64))

    cloud: Mapped[Cloud] = relationship(back_populates="regions")
    zones: Mapped[list[Zone]] = relationship(
        back_populates="region", cascade="all, delete-orphan", order_by="Zone.name"
    )
    instance_types: Mapped[list[InstanceType]] = relationship(
        back_populates="region", cascade="all, delete-orphan", order_by="InstanceType.name"
    )

    __table_args__ = (UniqueConstraint("cloud_id", "name"),)


class Zone(UUIDPrimaryKey, Base):
    __tablename__ = "zones"

    region_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("regions.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    subnet: Mapped[str | None] = mapped_column(String(500))

    region: Mapped[Region] = relationship(back_populates="zones")

    __table_args__ = (UniqueConstraint("region_id", "name"),)


class InstanceType(UUIDPrimaryKey, Base):
    __tablename__ = "instance_types"

    region_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("regions.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    gpu_type: Mapped[str] = mapped_column(String(32))
    gpu_count: Mapped[int] = mapped_column(Integer)
    gpu_memory_gb: Mapped[float] = mapped_column(Float)
    vcpus: Mapped[int | None] = mapped_column(Integer)
    memory_gb: Mapped[float | None] = mapped_column(Float)
    on_demand_price: Mapped[float] = mapped_column(Float)
    spot_price: Mapped[float | None] = mapped_column(Float)
    # Zones offering this type; NULL means every zone of the region.
    zones: Mapped[list[str] | None] = mapped_column(JSONType)

    region: Mapped[Region] = relationship(back_populates="instance_types")

    __table_args__ = (
        UniqueConstraint("region_id", "name"),
        CheckConstraint("gpu_count >= 1", name="gpu_count_positive"),
    )


class Model(UUIDPrimaryKey, Timestamps, Base):
    __tablename__ = "models"

    name: Mapped[str] = mapped_column(String(128), unique=True)
    display_name: Mapped[str] = mapped_column(String(200), default="")
    description: Mapped[str] = mapped_column(String(2000), default="")
    default_tier: Mapped[str | None] = mapped_column(String(16))

    variants: Mapped[list[ModelVariant]] = relationship(
        back_populates="model", cascade="all, delete-orphan", order_by="ModelVariant.tier"
    )


class ModelVariant(UUIDPrimaryKey, Timestamps, Base):
    """A model at one quantization tier, with what it needs from the hardware."""

    __tablename__ = "model_variants"

    model_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("models.id", ondelete="CASCADE"))
    tier: Mapped[str] = mapped_column(String(16))  # bf16, fp8, int4, awq…
    # Value for SGLang's --quantization (None for unquantized tiers).
    quantization: Mapped[str | None] = mapped_column(String(32))
    model_path: Mapped[str] = mapped_column(String(500))  # artifact URI or hub-style path
    engine_args: Mapped[dict] = mapped_column(JSONType, default=dict)
    gpu_count: Mapped[int] = mapped_column(Integer, default=1)
    gpu_memory_gb: Mapped[float] = mapped_column(Float)  # needed per GPU
    gpu_types: Mapped[list[str] | None] = mapped_column(JSONType)  # allowed GPU types; NULL = any
    context_length: Mapped[int] = mapped_column(Integer)
    size_gb: Mapped[float | None] = mapped_column(Float)  # weights on disk, for cold-start estimates
    # Profiled throughput of one replica per GPU type inside the SLO ({"h100": 9100.0, …}), in
    # weighted tokens/s: prompt tokens plus ``output_token_weight`` × generated tokens. What
    # placement compares GPU types by (tokens/s per dollar) and the autoscaler sizes replicas with.
    # Profile it where a replica serves the fewest weighted tokens inside the SLO (the longest
    # prompts the variant sees: prefill's share of TTFT grows with them): the autoscaler's SLO
    # feedback grows a low profile back (up to ``AutoscalerConfig.capacity_scale_max``), but cuts
    # a high one only after a breach.
    profiled_tokens_per_s: Mapped[dict] = mapped_column(JSONType, default=dict)
    # What one generated token costs a replica, in prompt tokens, from the same profile (decode
    # runs a step per token, prefill a whole prompt per step: typically 2-6). None counts them
    # alike, which sizes a pool by request rate × length and misses a shift to long outputs.
    output_token_weight: Mapped[float | None] = mapped_column(Float)

    model: Mapped[Model] = relationship(back_populates="variants")

    __table_args__ = (
        UniqueConstraint("model_id", "tier"),
        CheckConstraint("gpu_count >= 1 AND context_length >= 1 AND gpu_memory_gb > 0", name="sane_needs"),
    )
