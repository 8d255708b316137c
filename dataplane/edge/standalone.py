"""Standalone mode: a static config file instead of a control plane (small deployments, benchmarks).

``nimbus-edge --config edge.json``. The file is turned into a snapshot (same shape as the control
plane's, see ``snapshot.py``) with stable, name-derived ids, so the rest of the edge has one code
path. Format::

    {
      "settings": {"policy": "predicted_ttft", "queue_timeout_s": 30, ...},   # any EdgeSettings field
      "regions": [{"name": "local", "rtt_ms": 0.2}],
      "models": [{
        "name": "llama-3.1-8b-instruct", "default_tier": "bf16",
        "tiers": [{
          "tier": "bf16", "served_model_name": "llama-3.1-8b-instruct", "context_length": 8192,
          "replicas": [
            "http://127.0.0.1:30000",
            {"url": "http://10.0.0.7:30000", "region": "gcp/us-central1",
             "max_running_requests": 64, "max_total_tokens": 200000}
          ]
        }]
      }],
      "tenants": [{
        "name": "acme", "weight": 1.0, "response_cache": false,
        "limits": {"requests_per_minute": 600, "tokens_per_minute": 200000,
                   "max_concurrent_requests": 32, "monthly_token_budget": null},
        "keys": [
          {"sha256": "<hex sha256 of the full key>", "priority": "interactive"},
          {"dev_key": "nmb_dev00001_not-a-secret", "priority": "batch"}
        ]
      }]
    }

``dev_key`` carries a plaintext key and exists for local development and benchmarks only; the edge
logs a warning when it sees one. Production configs carry ``sha256`` entries.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger("nimbus.edge.standalone")

_NS = uuid.UUID("8f0b2a4e-2c51-4a8e-9d7e-6e0f3c1a9b11")
DEFAULT_REGION = "local"


def _id(*parts: str) -> str:
    return str(uuid.uuid5(_NS, "/".join(parts)))


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_prefix(key: str) -> str:
    """``nmb_ab12cd34_secret`` -> ``nmb_ab12cd34`` (the part that is safe to log)."""
    head, _, _ = key.rpartition("_")
    return head if head.startswith("nmb_") else key[:12]


def load_config(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def config_to_snapshot(cfg: dict[str, Any]) -> dict[str, Any]:
    regions = [{"name": r["name"], "rtt_ms": r.get("rtt_ms")} for r in cfg.get("regions", [])]
    known_regions = {r["name"] for r in regions}
    models, pools, replicas = [], [], []
    for m in cfg.get("models", []):
        variants = []
        for t in m.get("tiers", []):
            vid = _id("variant", m["name"], t["tier"])
            variants.append({
                "id": vid, "tier": t["tier"], "context_length": int(t.get("context_length", 8192)),
                "served_model_name": t.get("served_model_name", m["name"]),
                "priority_scheduling": t.get("priority_scheduling"),
                "task": t.get("task", "generate"),
            })
            pid = _id("pool", m["name"], t["tier"])
            pools.append({"id": pid, "variant_id": vid, "kind": t.get("kind", "warm"),
                          "dedicated_tenant_id": None, "ttft_slo_ms": t.get("ttft_slo_ms")})
            for i, rep in enumerate(t.get("replicas", [])):
                rep = {"url": rep} if isinstance(rep, str) else dict(rep)
                region = rep.get("region", DEFAULT_REGION)
                if region not in known_regions:
                    regions.append({"name": region, "rtt_ms": None})
                    known_regions.add(region)
                replicas.append({
                    "id": rep.get("id") or _id("replica", m["name"], t["tier"], str(i), rep["url"]),
                    "pool_id": pid, "variant_id": vid, "region": region, "url": rep["url"],
                    "state": rep.get("state", "ready"),
                    "max_running_requests": int(rep.get("max_running_requests", 64)),
                    "max_total_tokens": int(rep.get("max_total_tokens", 200_000)),
                    "metrics": {},
                })
        default_tier = m.get("default_tier") or (variants[0]["tier"] if variants else "")
        models.append({"name": m["name"], "default_tier": default_tier, "variants": variants})
    tenants, keys = [], []
    for t in cfg.get("tenants", []):
        tid = t.get("id") or _id("tenant", t["name"])
        tenants.append({
            "id": tid, "name": t["name"], "status": t.get("status", "active"),
            "weight": float(t.get("weight", 1.0)), "limits": dict(t.get("limits") or {}),
            "response_cache": bool(t.get("response_cache", False)),
            "semantic_cache": t.get("semantic_cache"),  # {"models": [...], "threshold": 0.875} or absent
        })
        for i, k in enumerate(t.get("keys", [])):
            if "dev_key" in k:
                log.warning("config holds a plaintext dev_key for tenant %s; use sha256 entries in production",
                            t["name"])
                digest, prefix = key_sha256(k["dev_key"]), key_prefix(k["dev_key"])
            else:
                digest, prefix = k["sha256"].lower(), k.get("prefix", "")
            keys.append({
                "id": k.get("id") or _id("key", tid, str(i)), "tenant_id": tid, "prefix": prefix,
                "sha256": digest, "scopes": k.get("scopes", ["inference"]),
                "expires_at": k.get("expires_at"), "priority": k.get("priority", "interactive"),
                "allowed_models": k.get("allowed_models"),
            })
    body = {"tenants": tenants, "keys": keys, "models": models, "pools": pools,
            "replicas": replicas, "regions": regions}
    etag = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return {"etag": etag, "generated_at": None, **body}
