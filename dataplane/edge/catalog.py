"""An immutable, indexed view of one snapshot: what the hot path looks things up in.

Built once per snapshot change (every few seconds at most), so the per-request lookups are plain
dict reads. Live state (in-flight counts, prefix index, breakers, health) is kept elsewhere, keyed
by replica id, so it survives snapshot swaps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

INTERACTIVE = "interactive"
BATCH = "batch"
PRIORITIES = (INTERACTIVE, BATCH)


@dataclass(frozen=True, slots=True)
class Limits:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    monthly_token_budget: int | None = None
    monthly_tokens_used: int = 0

    @property
    def unlimited(self) -> bool:
        return (
            self.requests_per_minute is None
            and self.tokens_per_minute is None
            and self.max_concurrent_requests is None
            and self.monthly_token_budget is None
        )


@dataclass(frozen=True, slots=True)
class Tenant:
    id: str
    name: str
    status: str
    weight: float
    limits: Limits
    response_cache: bool
    # The semantic cache, opted into per model (model names as clients send them), with the
    # tenant's similarity threshold (the control plane keeps it within the operator's bounds).
    semantic_models: frozenset[str] = frozenset()
    semantic_threshold: float = 1.0

    def semantic_for(self, model: str) -> bool:
        return model in self.semantic_models


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    tenant_id: str
    prefix: str
    sha256: str
    scopes: tuple[str, ...]
    expires_at: datetime | None
    priority: str
    # "name" (every tier) or "name:tier" entries; None: every model the tenant may use
    allowed_models: frozenset[str] | None = None

    def allows(self, model: str, tier: str) -> bool:
        """May this key call ``model`` at ``tier``? Outside its allowlist a model does not exist
        for the key: the edge answers 404 and leaves it out of ``/v1/models``."""
        allowed = self.allowed_models
        return allowed is None or model in allowed or f"{model}:{tier}" in allowed


@dataclass(frozen=True, slots=True)
class Variant:
    id: str
    model: str
    tier: str
    context_length: int
    served_model_name: str
    # How its engines order SGLang's ``priority`` field: "high_first", "low_first", or None when they
    # run without priority scheduling (then the edge never sends one).
    priority_scheduling: str | None = None
    task: str = "generate"  # or "embed": engines started with --is-embedding serve /v1/embeddings only


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    default_tier: str
    variants: dict[str, Variant]  # by tier


@dataclass(frozen=True, slots=True)
class Pool:
    id: str
    variant_id: str
    kind: str
    dedicated_tenant_id: str | None
    ttft_slo_s: float | None = None  # None: no SLO, its queued requests are served in arrival order


@dataclass(frozen=True, slots=True)
class Replica:
    id: str
    pool_id: str
    variant_id: str
    region: str
    url: str
    state: str
    max_running_requests: int
    max_total_tokens: int
    num_running_reqs: int = 0
    num_queue_reqs: int = 0
    token_usage: float = 0.0
    cache_hit_rate: float = 0.0


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    rtt_ms: float | None


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(slots=True)
class Catalog:
    etag: str
    tenants: dict[str, Tenant] = field(default_factory=dict)
    keys_by_hash: dict[str, ApiKey] = field(default_factory=dict)
    keys_by_id: dict[str, ApiKey] = field(default_factory=dict)  # the batch runner names its key by id
    models: dict[str, Model] = field(default_factory=dict)
    variants: dict[str, Variant] = field(default_factory=dict)
    pools: dict[str, Pool] = field(default_factory=dict)
    replicas: dict[str, Replica] = field(default_factory=dict)
    regions: dict[str, Region] = field(default_factory=dict)
    # variant id -> pools serving it
    pools_by_variant: dict[str, list[Pool]] = field(default_factory=dict)
    # pool id -> ready replicas
    ready_by_pool: dict[str, list[Replica]] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, snap: dict[str, Any]) -> Catalog:
        cat = cls(etag=str(snap.get("etag", "")))
        for t in snap.get("tenants", []):
            lim = t.get("limits") or {}
            cat.tenants[t["id"]] = Tenant(
                id=t["id"], name=t.get("name", t["id"]), status=t.get("status", "active"),
                weight=float(t.get("weight") or 1.0),
                limits=Limits(
                    requests_per_minute=_int_or_none(lim.get("requests_per_minute")),
                    tokens_per_minute=_int_or_none(lim.get("tokens_per_minute")),
                    max_concurrent_requests=_int_or_none(lim.get("max_concurrent_requests")),
                    monthly_token_budget=_int_or_none(lim.get("monthly_token_budget")),
                    monthly_tokens_used=int(lim.get("monthly_tokens_used") or 0),
                ),
                response_cache=bool(t.get("response_cache", False)),
                semantic_models=frozenset((t.get("semantic_cache") or {}).get("models") or ()),
                semantic_threshold=float((t.get("semantic_cache") or {}).get("threshold") or 1.0),
            )
        for k in snap.get("keys", []):
            cat.keys_by_hash[k["sha256"].lower()] = cat.keys_by_id[k["id"]] = ApiKey(
                id=k["id"], tenant_id=k["tenant_id"], prefix=k.get("prefix", ""), sha256=k["sha256"].lower(),
                scopes=tuple(k.get("scopes") or ("inference",)), expires_at=_parse_time(k.get("expires_at")),
                priority=k.get("priority") if k.get("priority") in PRIORITIES else INTERACTIVE,
                allowed_models=None if k.get("allowed_models") is None else frozenset(k["allowed_models"]),
            )
        for m in snap.get("models", []):
            variants: dict[str, Variant] = {}
            for v in m.get("variants", []):
                variant = Variant(
                    id=v["id"], model=m["name"], tier=v["tier"], context_length=int(v.get("context_length") or 0),
                    served_model_name=v.get("served_model_name") or m["name"],
                    priority_scheduling=v.get("priority_scheduling") if v.get("priority_scheduling") in (
                        "high_first", "low_first") else None,
                    task="embed" if v.get("task") == "embed" else "generate",
                )
                variants[variant.tier] = variant
                cat.variants[variant.id] = variant
            default_tier = m.get("default_tier") or next(iter(variants), "")
            cat.models[m["name"]] = Model(name=m["name"], default_tier=default_tier, variants=variants)
        for p in snap.get("pools", []):
            slo_ms = p.get("ttft_slo_ms")
            pool = Pool(id=p["id"], variant_id=p["variant_id"], kind=p.get("kind", "warm"),
                        dedicated_tenant_id=p.get("dedicated_tenant_id"),
                        ttft_slo_s=float(slo_ms) / 1000 if slo_ms else None)
            cat.pools[pool.id] = pool
            cat.pools_by_variant.setdefault(pool.variant_id, []).append(pool)
        for r in snap.get("replicas", []):
            met = r.get("metrics") or {}
            replica = Replica(
                id=r["id"], pool_id=r["pool_id"], variant_id=r["variant_id"], region=r.get("region", ""),
                url=r["url"].rstrip("/"), state=r.get("state", "ready"),
                max_running_requests=int(r.get("max_running_requests") or 64),
                max_total_tokens=int(r.get("max_total_tokens") or 100_000),
                num_running_reqs=int(met.get("num_running_reqs") or 0),
                num_queue_reqs=int(met.get("num_queue_reqs") or 0),
                token_usage=float(met.get("token_usage") or 0.0),
                cache_hit_rate=float(met.get("cache_hit_rate") or 0.0),
            )
            cat.replicas[replica.id] = replica
            if replica.state == "ready":
                cat.ready_by_pool.setdefault(replica.pool_id, []).append(replica)
        for g in snap.get("regions", []):
            rtt = g.get("rtt_ms")
            cat.regions[g["name"]] = Region(name=g["name"], rtt_ms=None if rtt is None else float(rtt))
        return cat

    # ---- lookups used on the hot path ----

    def resolve_model(self, requested: str) -> tuple[Model, Variant] | None:
        """``name`` or ``name:tier``; the tier picks the quantization variant."""
        name, _, tier = requested.partition(":")
        model = self.models.get(name)
        if model is None:
            return None
        variant = model.variants.get(tier or model.default_tier)
        return None if variant is None else (model, variant)

    def usable_pools(self, tenant_id: str, variant_id: str) -> list[Pool]:
        """Shared pools plus the tenant's own dedicated pools; another tenant's dedicated pool never."""
        return [
            p for p in self.pools_by_variant.get(variant_id, ())
            if p.dedicated_tenant_id is None or p.dedicated_tenant_id == tenant_id
        ]

    def candidates(self, tenant_id: str, variant_id: str) -> list[Replica]:
        """Ready replicas of every pool this tenant may use for the variant."""
        return [r for p in self.usable_pools(tenant_id, variant_id) for r in self.ready_by_pool.get(p.id, ())]

    def ttft_slo_s(self, tenant_id: str, variant_id: str) -> float | None:
        """The tightest TTFT SLO among the pools this tenant may use for the variant (None: none has one)."""
        slos = [p.ttft_slo_s for p in self.usable_pools(tenant_id, variant_id) if p.ttft_slo_s is not None]
        return min(slos) if slos else None

    def visible_models(self, tenant_id: str) -> list[tuple[Model, Variant]]:
        out = []
        for model in self.models.values():
            for variant in model.variants.values():
                if self.usable_pools(tenant_id, variant.id):
                    out.append((model, variant))
        return out

    def rtt_ms(self, region: str) -> float | None:
        reg = self.regions.get(region)
        return None if reg is None else reg.rtt_ms
