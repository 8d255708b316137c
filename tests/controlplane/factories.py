"""Builders for test data through the public admin API (no ORM shortcuts)."""

from __future__ import annotations

import copy
import uuid

CATALOG = {
    "version": 1,
    "generated_by": "tests",
    "clouds": [
        {
            "name": "aws",
            "regions": [
                {
                    "name": "us-east-1",
                    "template": {"kind": "aws_launch_template", "id": "lt-0123456789abcdef0"},
                    "zones": [{"name": "us-east-1a", "subnet": "subnet-a"}, {"name": "us-east-1b", "subnet": "subnet-b"}],
                    "instance_types": [
                        {"name": "g6.xlarge", "gpu_type": "l4", "gpu_count": 1, "gpu_memory_gb": 24,
                         "on_demand_price": 0.8, "spot_price": 0.3},
                        {"name": "p5.48xlarge", "gpu_type": "h100", "gpu_count": 8, "gpu_memory_gb": 80,
                         "on_demand_price": 98.3, "spot_price": 40.0},
                    ],
                },
                {
                    "name": "us-west-2",
                    "template": {"kind": "aws_launch_template", "id": "lt-0fedcba9876543210"},
                    "zones": [{"name": "us-west-2a"}],
                    "instance_types": [
                        {"name": "g6.xlarge", "gpu_type": "l4", "gpu_count": 1, "gpu_memory_gb": 24,
                         "on_demand_price": 0.8, "spot_price": None},
                    ],
                },
            ],
        },
        {
            "name": "gcp",
            "project": "nimbus-test",
            "regions": [
                {
                    "name": "us-central1",
                    "template": {"kind": "gcp_instance_template", "id": "projects/p/global/instanceTemplates/gpu"},
                    "zones": [{"name": "us-central1-a"}, {"name": "us-central1-b"}],
                    "instance_types": [
                        {"name": "a3-highgpu-8g", "gpu_type": "h100", "gpu_count": 8, "gpu_memory_gb": 80,
                         "on_demand_price": 88.0, "spot_price": 30.0},
                    ],
                }
            ],
        },
    ],
}


def catalog() -> dict:
    return copy.deepcopy(CATALOG)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def import_catalog(client, admin) -> dict:
    r = await client.post("/admin/v1/catalog/import", json=catalog(), headers=admin)
    assert r.status_code == 200, r.text
    return r.json()


async def create_tenant(client, admin, **extra) -> dict:
    r = await client.post("/admin/v1/tenants", json={"name": unique("t"), **extra}, headers=admin)
    assert r.status_code == 201, r.text
    return r.json()


async def create_key(client, admin, tenant_id: str, scopes=("inference", "manage"), **extra) -> tuple[dict, str]:
    r = await client.post(f"/admin/v1/tenants/{tenant_id}/keys", json={"scopes": list(scopes), **extra}, headers=admin)
    assert r.status_code == 201, r.text
    body = r.json()
    return body["key"], body["secret"]


async def create_model(client, admin, tiers=("bf16", "fp8")) -> dict:
    variants = [
        {"tier": t, "model_path": f"meta-llama/Llama-3.1-8B-Instruct{'-FP8' if t == 'fp8' else ''}",
         "gpu_memory_gb": 20 if t == "bf16" else 12, "context_length": 8192,
         "quantization": "fp8" if t == "fp8" else None}
        for t in tiers
    ]
    r = await client.post("/admin/v1/models", json={"name": unique("llama"), "variants": variants}, headers=admin)
    assert r.status_code == 201, r.text
    return r.json()


async def create_pool(client, admin, variant_id: str, **extra) -> dict:
    body = {"name": unique("pool"), "variant_id": variant_id,
            "placement": [{"cloud": "aws", "region": "us-east-1"}], "min_replicas": 1, "max_replicas": 3, **extra}
    r = await client.post("/admin/v1/pools", json=body, headers=admin)
    assert r.status_code == 201, r.text
    return r.json()
