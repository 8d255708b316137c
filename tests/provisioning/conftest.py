"""Provisioning fixtures: real Postgres, Redis, moto server and a Celery worker; the GCE REST double.

Reused, not copied: the moto server, EC2 client and GCE double come from tests/infra, the
Postgres database and admin client from tests/ and tests/controlplane.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
import redis
from pydantic import SecretStr

from controlplane.config import Settings
from controlplane.db.engine import session_scope
from tests.controlplane.conftest import ADMIN_TOKEN, EDGE_TOKEN, admin, client  # noqa: F401 (fixtures)
from tests.infra.conftest import (  # noqa: F401 (fixtures)
    AWS_REGION,
    GCP_PROJECT,
    GCP_TEMPLATE,
    GCP_TEMPLATE_EAST4,
    aws,
    aws_session,
    aws_template,
    ec2,
    gce,
    gcp,
    moto_ami,
    moto_endpoint,
)

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def cluster() -> str:
    # Lower-case so it round-trips through GCP labels; unique so tests never see each other's VMs.
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def settings(db_url: str, tmp_path, cluster: str) -> Settings:
    return Settings(
        database_url=db_url,
        admin_token=SecretStr(ADMIN_TOKEN),
        edge_token=SecretStr(EDGE_TOKEN),
        state_dir=tmp_path / "state",
        cluster_name=cluster,
        broker_url=REDIS_URL,
        redis_url=REDIS_URL,
        celery_key_prefix=f"{cluster}:",
        usage_stream=f"{cluster}:usage",
        lease_seconds=30,
        retry_delay_s=0.5,
        reconcile_interval_s=0.5,
        drain_timeout_s=0,
        block_zone_s=60,
        block_region_s=60,
        block_cloud_s=60,
        db_pool_size=4,
        # These tests size pools by hand (desired_replicas); the autoscaler has its own tests.
        autoscaler_enabled=False,
    )


@pytest.fixture
def west_template(ec2: Any, moto_ami: str, moto_endpoint: str, aws_session: boto3.Session) -> str:  # noqa: F811
    west = aws_session.client("ec2", endpoint_url=moto_endpoint, region_name="us-west-2")
    image = west.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]
    lt = west.create_launch_template(
        LaunchTemplateName="nimbus-gpu-us-west-2", LaunchTemplateData={"ImageId": image, "InstanceType": "g5.xlarge"}
    )
    return lt["LaunchTemplate"]["LaunchTemplateId"]


def _itype(name: str, gpu: str, count: int, mem: float, od: float, spot: float | None) -> dict:
    return {"name": name, "gpu_type": gpu, "gpu_count": count, "gpu_memory_gb": mem,
            "on_demand_price": od, "spot_price": spot}


def aws_catalog(east_template: str, west_template: str | None = None) -> dict:
    regions = [
        {
            "name": AWS_REGION,
            "template": {"kind": "aws_launch_template", "id": east_template},
            "artifact_bucket": "s3://nimbus-artifacts-us-east-1",
            "zones": [{"name": "us-east-1a"}, {"name": "us-east-1b"}, {"name": "us-east-1c"}],
            "instance_types": [_itype("g5.xlarge", "a10g", 1, 24, 1.0, 0.4)],
        }
    ]
    if west_template:
        regions.append({
            "name": "us-west-2",
            "template": {"kind": "aws_launch_template", "id": west_template},
            "zones": [{"name": "us-west-2a"}, {"name": "us-west-2b"}],
            "instance_types": [_itype("g5.xlarge", "a10g", 1, 24, 1.1, 0.5)],
        })
    return {"version": 1, "generated_by": "tests", "clouds": [{"name": "aws", "regions": regions}]}


GCP_CATALOG = {
    "version": 1,
    "generated_by": "tests",
    "clouds": [
        {
            "name": "gcp",
            "project": GCP_PROJECT,
            "regions": [
                {
                    "name": "us-central1",
                    "template": {"kind": "gcp_instance_template", "id": GCP_TEMPLATE},
                    "zones": [{"name": "us-central1-a"}, {"name": "us-central1-b"}],
                    "instance_types": [_itype("g2-standard-8", "l4", 1, 24, 0.85, 0.3)],
                },
                {
                    "name": "us-east4",
                    "template": {"kind": "gcp_instance_template", "id": GCP_TEMPLATE_EAST4},
                    "zones": [{"name": "us-east4-a"}],
                    "instance_types": [_itype("g2-standard-8", "l4", 1, 24, 0.9, 0.35)],
                },
            ],
        }
    ],
}


def gcp_catalog() -> dict:
    return copy.deepcopy(GCP_CATALOG)


async def setup_pool(client, admin, catalog: dict, placement: list[dict], **pool) -> dict:  # noqa: F811
    """Catalog, model and pool through the real admin API; returns the pool."""
    from tests.controlplane.factories import create_model, create_pool

    r = await client.post("/admin/v1/catalog/import", json=catalog, headers=admin)
    assert r.status_code == 200, r.text
    model = await create_model(client, admin, tiers=("bf16",))
    return await create_pool(client, admin, model["variants"][0]["id"], placement=placement, **pool)


class Clouds:
    """Provider lookup for the services: the real adapters, pointed at moto / the GCE double."""

    def __init__(self, **providers: Any) -> None:
        self.providers = providers

    def __call__(self, cloud: str):
        return self.providers[cloud]


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield r
    r.close()


@pytest.fixture
def celery_keys_cleanup(redis_client: redis.Redis, cluster: str) -> Iterator[None]:
    """Delete this test's Celery and stream keys from the shared Redis afterwards."""
    yield
    keys = list(redis_client.scan_iter(f"{cluster}:*")) + list(redis_client.scan_iter(f"_kombu.binding.*{cluster}*"))
    if keys:
        redis_client.delete(*keys)


def db(settings: Settings):
    return session_scope(settings)
