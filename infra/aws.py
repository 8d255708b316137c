"""AWS EC2 adapter (boto3).

Launches one instance per request from the region's launch template (made by
Terraform), overriding only what varies per node: instance type, zone/subnet, market,
user data and tags. Idempotency has two layers:

1. ``ClientToken`` on ``RunInstances``: EC2 returns the same instance for a repeated
   token, so a retried Celery task cannot create a second VM.
2. A ``nimbus-launch-token`` tag looked up before launching, so a retry also finds
   its VM when the token is no longer honoured by EC2 or by an emulator (moto ignores
   ``ClientToken``).

Every botocore failure leaves this module as an :mod:`infra.errors` type; the mapping
is the pure function :func:`map_client_error`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
from botocore.parsers import ResponseParserError

from infra.errors import (
    CapacityError,
    ConfigError,
    ProviderError,
    QuotaError,
    RetryPolicy,
    TransientError,
    retry,
)
from infra.provider import Instance, InstanceState, LaunchRequest

LAUNCH_TOKEN_TAG = "nimbus-launch-token"

# EC2 error codes → our types. Sources: the EC2 API error-code reference and the codes
# SkyPilot treats as retryable / zone-blocking.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacityOnHost",
        "Unsupported",  # instance type not offered in this zone
        "SpotMaxPriceTooLow",
        "InsufficientFreeAddressesInSubnet",  # the zone's subnet is full
    }
)
QUOTA_CODES = frozenset(
    {
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "VolumeLimitExceeded",
        "AddressLimitExceeded",
    }
)
AUTH_CODES = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "OptInRequired",
        "Blocked",
        "AccessDenied",
        "ExpiredToken",
    }
)
# Regional resources made by Terraform that are missing or wrong: block the region only.
REGIONAL_CONFIG_PREFIXES = (
    "InvalidLaunchTemplateId.",
    "InvalidLaunchTemplateName.",
    "InvalidAMIID.",
    "InvalidSubnetID.",
    "InvalidSubnet",
    "InvalidGroup.",
    "InvalidKeyPair.",
    "InvalidParameterValue",
)
TRANSIENT_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ServerInternal",
        "InternalError",
        "ServiceUnavailable",
        "Unavailable",
    }
)

_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "shutting-down": InstanceState.STOPPING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.TERMINATED,
    "terminated": InstanceState.TERMINATED,
}
_LIVE_STATES = ["pending", "running", "shutting-down", "stopping", "stopped"]


def map_client_error(exc: botocore.exceptions.ClientError) -> ProviderError:
    """Translate a botocore ``ClientError`` into the failover vocabulary."""
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    message = str(error.get("Message", "")) or str(exc)
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if code in CAPACITY_CODES:
        return CapacityError(message, code=code)
    if code in QUOTA_CODES:
        return QuotaError(message, code=code)
    if code in AUTH_CODES:
        return ConfigError(message, code=code)
    if code.startswith(REGIONAL_CONFIG_PREFIXES):
        return ConfigError(message, code=code, scope="region")
    if code in TRANSIENT_CODES or status >= 500:
        return TransientError(message, code=code or f"HTTP{status}")
    return ProviderError(message, code=code)


def map_boto_error(exc: Exception) -> ProviderError:
    """Any botocore exception → :class:`ProviderError` (connection trouble is transient)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return map_client_error(exc)
    if isinstance(exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
        return ConfigError(str(exc), code=type(exc).__name__)
    if isinstance(
        exc, botocore.exceptions.ConnectionError | botocore.exceptions.HTTPClientError | ResponseParserError
    ):
        return TransientError(str(exc), code=type(exc).__name__)
    return ProviderError(str(exc), code=type(exc).__name__)


def client_token(idempotency_token: str) -> str:
    """EC2 accepts at most 64 ASCII characters; hash longer tokens deterministically."""
    if len(idempotency_token) <= 64 and idempotency_token.isascii():
        return idempotency_token
    return hashlib.sha256(idempotency_token.encode()).hexdigest()


def launch_template_spec(template_id: str, version: str) -> dict[str, str]:
    """Catalog templates are ids (``lt-…``); accept names too for hand-made catalogs."""
    key = "LaunchTemplateId" if template_id.startswith("lt-") else "LaunchTemplateName"
    return {key: template_id, "Version": version}


def run_instances_params(req: LaunchRequest, template_version: str = "$Default") -> dict[str, Any]:
    """The ``RunInstances`` arguments for one node (pure, so tests can read them)."""
    token = client_token(req.idempotency_token)
    tags = [{"Key": k, "Value": v} for k, v in sorted({**req.all_tags(), LAUNCH_TOKEN_TAG: token}.items())]
    params: dict[str, Any] = {
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": token,
        "LaunchTemplate": launch_template_spec(req.template_id, template_version),
        "InstanceType": req.instance_type,
        "UserData": req.user_data,  # boto3 base64-encodes it
        "Placement": {"AvailabilityZone": req.zone},
        # Tag the volumes too, so the sweeper's cost report can attribute them.
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ],
    }
    if req.subnet:
        params["SubnetId"] = req.subnet
    if req.spot:
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    return params


def instance_from_ec2(region: str, data: Mapping[str, Any]) -> Instance:
    tags = {t["Key"]: t["Value"] for t in data.get("Tags", []) if not t["Key"].startswith("aws:")}
    return Instance(
        cloud="aws",
        region=region,
        zone=data.get("Placement", {}).get("AvailabilityZone", ""),
        instance_id=data["InstanceId"],
        instance_type=data.get("InstanceType", ""),
        state=_STATES.get(data.get("State", {}).get("Name", ""), InstanceState.PENDING),
        spot=data.get("InstanceLifecycle") == "spot",
        private_ip=data.get("PrivateIpAddress"),
        public_ip=data.get("PublicIpAddress"),
        tags=tags,
        launched_at=data.get("LaunchTime"),
    )


class AwsProvider:
    """EC2 behind the :class:`infra.provider.Provider` protocol.

    ``session`` (a ``boto3.Session``) carries credentials; ``endpoint_url`` points the
    client elsewhere (the moto server in tests). botocore's own retries are switched
    off so that throttling is retried in one place, by :func:`infra.errors.retry`.
    """

    cloud = "aws"

    def __init__(
        self,
        *,
        session: boto3.Session | None = None,
        endpoint_url: str | None = None,
        template_version: str = "$Default",
        retry_policy: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] | None = None,
        **session_kwargs: Any,
    ) -> None:
        self._session = session or boto3.Session(**session_kwargs)
        self._endpoint_url = endpoint_url
        self._template_version = template_version
        self._retry_policy = retry_policy
        self._sleep = sleep or time.sleep
        self._clients: dict[str, Any] = {}

    def _client(self, region: str) -> Any:
        if region not in self._clients:
            config = botocore.config.Config(
                retries={"total_max_attempts": 1}, connect_timeout=10, read_timeout=60
            )
            self._clients[region] = self._session.client(
                "ec2", region_name=region, endpoint_url=self._endpoint_url, config=config
            )
        return self._clients[region]

    def _call(self, region: str, operation: str, **params: Any) -> Any:
        def once() -> Any:
            try:
                return getattr(self._client(region), operation)(**params)
            except (botocore.exceptions.BotoCoreError, ResponseParserError) as exc:
                # A garbled response (an HTML error page from a proxy) is worth a retry.
                raise map_boto_error(exc) from exc
            except botocore.exceptions.ClientError as exc:
                raise map_client_error(exc) from exc

        return retry(once, self._retry_policy, sleep=self._sleep)

    def launch(self, req: LaunchRequest) -> Instance:
        params = run_instances_params(req, self._template_version)
        existing = self._find(req.region, {LAUNCH_TOKEN_TAG: params["ClientToken"]})
        if existing:
            return existing[0]
        response = self._call(req.region, "run_instances", **params)
        return instance_from_ec2(req.region, response["Instances"][0])

    def describe(self, region: str, instance_id: str) -> Instance | None:
        try:
            response = self._call(region, "describe_instances", InstanceIds=[instance_id])
        except ProviderError as exc:
            if exc.code.startswith("InvalidInstanceID."):
                return None
            raise
        found = [i for r in response.get("Reservations", []) for i in r.get("Instances", [])]
        return instance_from_ec2(region, found[0]) if found else None

    def terminate(self, region: str, instance_id: str) -> None:
        try:
            self._call(region, "terminate_instances", InstanceIds=[instance_id])
        except ProviderError as exc:
            if not exc.code.startswith("InvalidInstanceID."):
                raise

    def list_by_tag(self, region: str, tags: Mapping[str, str]) -> list[Instance]:
        return self._find(region, tags)

    def _find(self, region: str, tags: Mapping[str, str]) -> list[Instance]:
        filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()]
        filters.append({"Name": "instance-state-name", "Values": _LIVE_STATES})
        return [instance_from_ec2(region, i) for i in self._pages(region, filters)]

    def _pages(self, region: str, filters: list[dict[str, Any]]) -> Iterator[Mapping[str, Any]]:
        token: str | None = None
        while True:
            params: dict[str, Any] = {"Filters": filters, "MaxResults": 1000}
            if token:
                params["NextToken"] = token
            response = self._call(region, "describe_instances", **params)
            for reservation in response.get("Reservations", []):
                yield from reservation.get("Instances", [])
            token = response.get("NextToken")
            if not token:
                return
