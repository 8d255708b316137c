"""Fixtures for the infra tests: a real moto server, the GCE and GCS test doubles, a catalog."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from google.auth.credentials import AnonymousCredentials

from infra.aws import AwsProvider
from infra.errors import RetryPolicy
from infra.gcp import GcpProvider
from infra.local import LocalProvider
from tests.infra.gce_double import GceDouble
from tests.infra.gcs_double import GcsDouble, serve_gcs_double

AWS_REGION = "us-east-1"
GCP_PROJECT = "nimbus-test"
GCP_TEMPLATE = (
    f"https://www.googleapis.com/compute/v1/projects/{GCP_PROJECT}/regions/us-central1/instanceTemplates/nimbus-gpu-1"
)
GCP_TEMPLATE_EAST4 = f"projects/{GCP_PROJECT}/regions/us-east4/instanceTemplates/nimbus-gpu-2"
# What Terraform's regional template holds that a naive override would drop.
GCP_TEMPLATE_PROPERTIES = {
    "machineType": "g2-standard-8",
    "labels": {"managed-by": "nimbus", "nimbus-cluster": "prod-eu", "cost-center": "ml"},
    "metadata": {
        "items": [
            {"key": "block-project-ssh-keys", "value": "true"},
            {"key": "enable-oslogin", "value": "TRUE"},
            {"key": "serial-port-enable", "value": "false"},
        ]
    },
    "networkInterfaces": [
        {"network": "projects/nimbus-test/global/networks/nimbus", "subnetwork": "regions/us-central1/subnetworks/gpu", "stackType": "IPV4_ONLY"}
    ],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A real ``moto.server`` subprocess on a free loopback port, reached over HTTP."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/moto-api/", timeout=1)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def aws_session() -> boto3.Session:
    return boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=AWS_REGION)


@pytest.fixture
def ec2(moto_endpoint: str, aws_session: boto3.Session) -> Any:
    """A plain boto3 EC2 client on a freshly reset moto, for setup and assertions."""
    httpx.post(f"{moto_endpoint}/moto-api/reset").raise_for_status()
    return aws_session.client("ec2", endpoint_url=moto_endpoint)


@pytest.fixture(scope="session")
def moto_ami(moto_endpoint: str) -> str:
    """One of moto's default AMIs (listing them takes seconds, so once per session)."""
    client = boto3.client(
        "ec2",
        region_name=AWS_REGION,
        endpoint_url=moto_endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return client.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]


@pytest.fixture
def aws_template(ec2: Any, moto_ami: str) -> str:
    """A launch template like Terraform's, using one of moto's default AMIs."""
    ami = moto_ami
    lt = ec2.create_launch_template(
        LaunchTemplateName="nimbus-gpu-us-east-1",
        LaunchTemplateData={"ImageId": ami, "InstanceType": "g5.xlarge"},
    )
    return lt["LaunchTemplate"]["LaunchTemplateId"]


@pytest.fixture
def aws(moto_endpoint: str, aws_session: boto3.Session, ec2: Any) -> AwsProvider:
    return AwsProvider(session=aws_session, endpoint_url=moto_endpoint, retry_policy=RetryPolicy(attempts=2))


@pytest.fixture
def gce() -> Iterator[GceDouble]:
    double = GceDouble(GCP_PROJECT, operation_polls=2).start()
    double.add_template(GCP_TEMPLATE, GCP_TEMPLATE_PROPERTIES)
    double.add_template(GCP_TEMPLATE_EAST4, GCP_TEMPLATE_PROPERTIES)
    try:
        yield double
    finally:
        double.stop()


@pytest.fixture
def gcp(gce: GceDouble) -> GcpProvider:
    return GcpProvider(
        GCP_PROJECT,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": gce.endpoint},
        retry_policy=RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02),
    )


@pytest.fixture
def s3_bucket(moto_endpoint: str, aws_session: boto3.Session) -> str:
    """A fresh, empty bucket on the moto server (no reset: other tests' state is left alone)."""
    name = f"nimbus-test-{uuid.uuid4().hex[:12]}"
    aws_session.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsDouble]:
    """The GCS JSON API test double (tests/infra/gcs_double.py) under uvicorn on a loopback port.

    Point ``infra.objectstore.GCSStore`` (or any google-cloud-storage client) at
    ``gcs_server.endpoint``; it records every request in ``gcs_server.requests``.
    """
    with serve_gcs_double() as double:
        yield double


@pytest.fixture
def gcs_bucket(gcs_server: GcsDouble) -> str:
    """A fresh, empty bucket in the GCS double."""
    name = f"nimbus-test-{uuid.uuid4().hex[:12]}"
    gcs_server.create_bucket(name)
    return name


# A harmless stand-in for the node agent: it records what it was started with, then idles.
SLEEPER = (
    "{python}",
    "-c",
    "import json, os, sys, time; "
    "json.dump({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() if k.startswith('NIMBUS_')}}, "
    "open('started.json', 'w')); time.sleep(60)",
    "{node_id}",
    "{config_path}",
)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalProvider]:
    """A local provider running SLEEPER; every instance is terminated when the test ends."""
    provider = LocalProvider(tmp_path / "local-cloud", SLEEPER, stop_grace=2.0)
    try:
        yield provider
    finally:
        for region in ("local", "local-2"):
            for inst in provider.list_by_tag(region, {}):
                provider.terminate(region, inst.instance_id)


@pytest.fixture
def now() -> datetime:
    return datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def catalog_dict() -> dict[str, Any]:
    """Two clouds, two AWS regions; prices chosen so ordering is easy to read."""

    def itype(name: str, gpu: str, count: int, mem: float, od: float, spot: float | None, **kw: Any) -> dict:
        return {
            "name": name,
            "gpu_type": gpu,
            "gpu_count": count,
            "gpu_memory_gb": mem,
            "on_demand_price": od,
            "spot_price": spot,
            **kw,
        }

    return {
        "version": 1,
        "generated_by": "tests",
        "clouds": [
            {
                "name": "aws",
                "regions": [
                    {
                        "name": "us-east-1",
                        "template": {"kind": "aws_launch_template", "id": "lt-east"},
                        "zones": [
                            {"name": "us-east-1a", "subnet": "subnet-a"},
                            {"name": "us-east-1b", "subnet": "subnet-b"},
                            {"name": "us-east-1c", "subnet": "subnet-c"},
                        ],
                        "instance_types": [
                            itype("g5.xlarge", "a10g", 1, 24, 1.0, 0.4),
                            itype("g6e.xlarge", "l40s", 1, 48, 1.9, 0.8),
                            itype("p5.48xlarge", "h100", 8, 80, 98.0, None, zones=["us-east-1a"]),
                        ],
                    },
                    {
                        "name": "us-west-2",
                        "template": {"kind": "aws_launch_template", "id": "lt-west"},
                        "zones": [{"name": "us-west-2a"}, {"name": "us-west-2b"}],
                        "instance_types": [itype("g6e.xlarge", "l40s", 1, 48, 2.0, 0.7)],
                    },
                ],
            },
            {
                "name": "gcp",
                "project": GCP_PROJECT,
                "regions": [
                    {
                        "name": "us-central1",
                        "template": {"kind": "gcp_instance_template", "id": GCP_TEMPLATE},
                        "zones": [{"name": "us-central1-a"}, {"name": "us-central1-b"}],
                        "instance_types": [itype("g2-standard-8", "l4", 1, 24, 0.85, 0.3)],
                    }
                ],
            },
        ],
    }
