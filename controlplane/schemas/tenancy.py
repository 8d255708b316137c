from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Literal

import msgspec

from controlplane.schemas.common import Name, NonNegInt, Text200

Scope = Literal["inference", "manage"]
PriorityName = Literal["interactive", "batch"]
Email = Annotated[str, msgspec.Meta(max_length=320, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")]
Password = Annotated[str, msgspec.Meta(min_length=10, max_length=200)]
Weight = Annotated[float, msgspec.Meta(gt=0, le=1000)]


class QuotaBody(msgspec.Struct, omit_defaults=False):
    """NULL (or absent) means unlimited."""

    requests_per_minute: NonNegInt | None = None
    tokens_per_minute: NonNegInt | None = None
    max_concurrent_requests: NonNegInt | None = None
    max_gpus: NonNegInt | None = None
    monthly_token_budget: NonNegInt | None = None


class TenantCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: Name
    display_name: Text200 = ""
    email: Email | None = None
    password: Password | None = None
    weight: Weight = 1.0
    response_cache: bool = False
    quota: QuotaBody | None = None


class TenantUpdate(msgspec.Struct, forbid_unknown_fields=True):
    display_name: Text200 | None = None
    email: Email | None = None
    password: Password | None = None
    weight: Weight | None = None
    response_cache: bool | None = None


class CacheSettings(msgspec.Struct, forbid_unknown_fields=True):
    """The tenant's response caches. Omitted fields stay as they are."""

    response_cache: bool | None = None  # the exact cache, every model
    semantic_cache_models: Annotated[list[ModelRef], msgspec.Meta(max_length=200)] | None = None  # [] turns it off
    semantic_cache_threshold: float | None = None  # cosine similarity; within the operator's bounds


class CacheSettingsOut(msgspec.Struct):
    response_cache: bool
    semantic_cache_models: list[str]
    semantic_cache_threshold: float  # the one in force (the tenant's, else the operator's default)
    threshold_bounds: tuple[float, float]  # what the operator allows


class TenantOut(msgspec.Struct):
    id: uuid.UUID
    name: str
    display_name: str
    email: str | None
    status: str
    weight: float
    response_cache: bool
    quota: QuotaBody
    created_at: dt.datetime
    updated_at: dt.datetime
    suspended_at: dt.datetime | None
    semantic_cache_models: list[str] = msgspec.field(default_factory=list)
    semantic_cache_threshold: float | None = None


# "name" (every tier of the model) or "name:tier"; the names the inference API accepts.
ModelRef = Annotated[str, msgspec.Meta(min_length=1, max_length=145, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*(:[a-z0-9]+)?$")]
ModelAllowlist = Annotated[list[ModelRef], msgspec.Meta(min_length=1, max_length=200)]


class KeyCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: Text200 = ""
    scopes: Annotated[list[Scope], msgspec.Meta(min_length=1, max_length=2)] = msgspec.field(
        default_factory=lambda: ["inference"]
    )
    priority: PriorityName = "interactive"
    expires_at: dt.datetime | None = None
    allowed_models: ModelAllowlist | None = None  # None: every model the tenant may use


class KeyUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """PATCH: only the fields sent change. ``allowed_models: null`` lifts the allowlist."""

    name: Text200 | msgspec.UnsetType = msgspec.UNSET
    allowed_models: ModelAllowlist | msgspec.UnsetType | None = msgspec.UNSET


class KeyOut(msgspec.Struct):
    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    prefix: str
    scopes: list[str]
    priority: str
    created_at: dt.datetime
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    last_used_at: dt.datetime | None
    allowed_models: list[str] | None = None


class KeyCreated(msgspec.Struct):
    """Returned once, at creation: the only time the secret is ever shown."""

    key: KeyOut
    secret: str
