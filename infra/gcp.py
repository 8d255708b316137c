"""GCP Compute Engine adapter (google-cloud-compute, REST transport).

Instances are inserted from the region's instance template (made by Terraform) with
per-node overrides: machine type, labels, ``user-data`` metadata, subnet and the SPOT
provisioning model. ``requestId`` (a UUID derived from the idempotency token) makes a
retried insert return the original operation; the instance name is derived from the
node id, so a duplicate that slips past ``requestId`` fails with ``alreadyExists`` and
is answered with the existing VM.

GCE instances are zonal, so :attr:`Instance.instance_id` is ``"<zone>/<name>"``;
treat it as opaque. Labels are GCP's tags and only allow ``[a-z0-9_-]`` (see
:func:`to_label`).

GCE reports capacity problems *inside* the zone operation rather than on the insert
call, so :meth:`GcpProvider.launch` waits for the operation before it returns.

Overriding ``metadata``, ``labels`` or ``networkInterfaces`` on insert replaces the
template's value rather than merging into it, and the template's metadata carries
security settings (OS Login, no project SSH keys, serial port off). So the adapter
reads the template once (templates are immutable, the result is cached) and sends
the template's items merged with the node's own.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc
from google.cloud import compute_v1

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

_REQUEST_ID_NAMESPACE = uuid.UUID("6f1c2a4e-3b7d-5c1e-9a0f-7e2d4b6c8a10")
_LABEL_MAX = 63
_NAME_MAX = 63

CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_POOL_EXHAUSTED",
        "insufficientCapacity",
        "resourceExhausted",
        "UNSUPPORTED_OPERATION",  # e.g. the accelerator is not offered in this zone
    }
)
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
TRANSIENT_CODES = frozenset(
    {
        "rateLimitExceeded",
        "userRateLimitExceeded",
        "RESOURCE_OPERATION_RATE_EXCEEDED",
        "RATE_LIMIT_EXCEEDED",
        "backendError",
        "internalError",
        "INTERNAL_ERROR",
        "SERVICE_UNAVAILABLE",
    }
)
# IAM, service accounts, VPC firewall/network: nothing in this cloud will work.
CONFIG_CODES = frozenset(
    {
        "forbidden",
        "accessNotConfigured",
        "PERMISSION_DENIED",
        "IAM_PERMISSION_DENIED",
        "SERVICE_ACCOUNT_ACCESS_DENIED",
        "authError",
        "required",  # "Login Required"
    }
)
_CLOUD_WIDE_QUOTA = "GPUS_ALL_REGIONS"

_STATES = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "REPAIRING": InstanceState.RUNNING,
    "STOPPING": InstanceState.STOPPING,
    "SUSPENDING": InstanceState.STOPPING,
    "PENDING_STOP": InstanceState.STOPPING,
    "STOPPED": InstanceState.TERMINATED,
    "SUSPENDED": InstanceState.TERMINATED,
    "TERMINATED": InstanceState.TERMINATED,
}


def classify(code: str, message: str, status: int = 0) -> ProviderError:
    """The failover type for a GCE error code (HTTP ``reason`` or operation ``code``)."""
    if code in CAPACITY_CODES or "ZONE_RESOURCE_POOL_EXHAUSTED" in message:
        return CapacityError(message, code=code)
    if code in QUOTA_CODES:
        scope = "cloud" if _CLOUD_WIDE_QUOTA in message else "region"
        return QuotaError(message, code=code, scope=scope)
    if code in TRANSIENT_CODES or status == 429 or status >= 500:
        return TransientError(message, code=code or f"HTTP{status}")
    if code in CONFIG_CODES or status in (401, 403):
        return ConfigError(message, code=code or f"HTTP{status}")
    if status in (400, 404):
        # A missing/invalid template, subnet or machine type: regional resources.
        if "does not exist in zone" in message:
            return CapacityError(message, code=code or "machineTypeNotInZone")
        return ConfigError(message, code=code or f"HTTP{status}", scope="region")
    return ProviderError(message, code=code or f"HTTP{status}")


def map_api_error(exc: Exception) -> ProviderError:
    """google-api-core / google-auth / transport exceptions → :class:`ProviderError`."""
    if isinstance(exc, gexc.GoogleAPICallError):
        errors = [e for e in (exc.errors or []) if isinstance(e, Mapping)]
        reason = exc.reason or (errors[0].get("reason", "") if errors else "")
        return classify(str(reason), exc.message or str(exc), int(exc.code or 0))
    if isinstance(exc, auth_exc.DefaultCredentialsError | auth_exc.RefreshError):
        return ConfigError(str(exc), code=type(exc).__name__)
    # requests' ConnectionError/Timeout derive from OSError, like the builtin ones.
    if isinstance(exc, auth_exc.TransportError | OSError):
        return TransientError(str(exc), code=type(exc).__name__)
    return ProviderError(str(exc), code=type(exc).__name__)


def operation_error(op: compute_v1.Operation) -> ProviderError | None:
    """The error a finished zone operation carries, if any (first one decides)."""
    errors = list(op.error.errors) if op.error else []
    if not errors:
        return None
    first = errors[0]
    return classify(first.code, first.message or first.code, int(op.http_error_status_code or 0))


def to_label(text: str) -> str:
    """A GCP label key/value: lower-case, ``[a-z0-9_-]`` only, at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:_LABEL_MAX]


def to_labels(tags: Mapping[str, str]) -> dict[str, str]:
    return {to_label(k): to_label(v) for k, v in tags.items()}


def instance_name(node_id: str) -> str:
    """A valid, deterministic GCE name for a node: ``[a-z]([-a-z0-9]{0,61}[a-z0-9])?``."""
    base = "nimbus-" + re.sub(r"[^a-z0-9-]", "-", node_id.lower())
    if len(base) > _NAME_MAX:
        digest = hashlib.sha256(node_id.encode()).hexdigest()[:10]
        base = f"{base[: _NAME_MAX - 11]}-{digest}"
    return base.rstrip("-") or "nimbus"


def request_id(idempotency_token: str) -> str:
    """GCE wants a UUID; derive one deterministically from any token."""
    try:
        return str(uuid.UUID(idempotency_token))
    except ValueError:
        return str(uuid.uuid5(_REQUEST_ID_NAMESPACE, idempotency_token))


def instance_id(zone: str, name: str) -> str:
    return f"{zone}/{name}"


def split_instance_id(value: str) -> tuple[str, str]:
    zone, sep, name = value.partition("/")
    if not sep or not zone or not name:
        raise ValueError(f"GCP instance ids look like '<zone>/<name>', got {value!r}")
    return zone, name


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


_TEMPLATE_LINK = re.compile(
    r"projects/(?P<project>[^/]+)/(?:global|regions/(?P<region>[^/]+))/instanceTemplates/(?P<name>[^/]+)$"
)


def parse_template(template_id: str) -> tuple[str, str | None, str]:
    """(project, region or None for a global template, name) from a template link."""
    m = _TEMPLATE_LINK.search(template_id)
    if not m:
        raise ConfigError(f"not an instance template link: {template_id!r}", code="BadTemplateLink", scope="region")
    return m["project"], m["region"], m["name"]


def insert_request(
    project: str, req: LaunchRequest, template: compute_v1.InstanceProperties | None = None
) -> compute_v1.InsertInstanceRequest:
    """The ``instances.insert`` call for one node (pure, so tests can read it).

    ``template`` is the source template's properties: its metadata items, labels and
    network interface are carried over because overriding a field replaces it whole.
    """
    template = template or compute_v1.InstanceProperties()
    items = {i.key: i.value for i in template.metadata.items} | {"user-data": req.user_data}
    resource = compute_v1.Instance(
        name=instance_name(req.node_id),
        machine_type=f"zones/{req.zone}/machineTypes/{req.instance_type}",
        labels={**template.labels, **to_labels(req.all_tags())},
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in items.items()]),
    )
    if req.spot:
        # SPOT VMs must not live-migrate or restart; DELETE leaves nothing to sweep.
        resource.scheduling = compute_v1.Scheduling(
            provisioning_model="SPOT",
            instance_termination_action="DELETE",
            on_host_maintenance="TERMINATE",
            automatic_restart=False,
        )
    if req.subnet:
        nics = [compute_v1.NetworkInterface(nic) for nic in template.network_interfaces] or [
            compute_v1.NetworkInterface()
        ]
        nics[0].subnetwork = req.subnet
        del nics[0].network  # implied by the subnetwork; the template's could conflict
        resource.network_interfaces = nics
    return compute_v1.InsertInstanceRequest(
        project=project,
        zone=req.zone,
        instance_resource=resource,
        source_instance_template=req.template_id,
        request_id=request_id(req.idempotency_token),
    )


def instance_from_gce(zone: str, data: compute_v1.Instance) -> Instance:
    ips = [nic.network_i_p for nic in data.network_interfaces if nic.network_i_p]
    public = [ac.nat_i_p for nic in data.network_interfaces for ac in nic.access_configs if ac.nat_i_p]
    created = data.creation_timestamp
    return Instance(
        cloud="gcp",
        region=region_of(zone),
        zone=zone,
        instance_id=instance_id(zone, data.name),
        instance_type=data.machine_type.rsplit("/", 1)[-1],
        state=_STATES.get(data.status, InstanceState.PENDING),
        spot=data.scheduling.provisioning_model == "SPOT",
        private_ip=ips[0] if ips else None,
        public_ip=public[0] if public else None,
        tags=dict(data.labels),
        launched_at=datetime.fromisoformat(created) if created else None,
    )


def _is_not_found(exc: ProviderError) -> bool:
    return exc.code in ("notFound", "HTTP404")


def label_filter(tags: Mapping[str, str]) -> str:
    return " AND ".join(f'(labels.{k} = "{v}")' for k, v in sorted(to_labels(tags).items()))


class GcpProvider:
    """Compute Engine behind the :class:`infra.provider.Provider` protocol.

    Pass ``credentials`` (``AnonymousCredentials`` for the test double) and
    ``client_options={"api_endpoint": ...}`` to point it elsewhere; by default the
    clients use application-default credentials.
    """

    cloud = "gcp"

    def __init__(
        self,
        project: str,
        *,
        credentials: Any = None,
        client_options: Mapping[str, Any] | None = None,
        retry_policy: RetryPolicy = RetryPolicy(),
        operation_timeout: float = 600.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.project = project
        options = dict(client_options or {})

        def client(cls: Any) -> Any:
            return cls(credentials=credentials, client_options=options, transport="rest")

        self._instances = client(compute_v1.InstancesClient)
        self._operations = client(compute_v1.ZoneOperationsClient)
        self._region_templates = client(compute_v1.RegionInstanceTemplatesClient)
        self._global_templates = client(compute_v1.InstanceTemplatesClient)
        self._template_cache: dict[str, compute_v1.InstanceProperties] = {}
        self._retry_policy = retry_policy
        self._operation_timeout = operation_timeout
        self._sleep = sleep
        self._clock = clock

    def _call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        def once() -> Any:
            try:
                return fn(**kwargs)
            except (gexc.GoogleAPICallError, auth_exc.GoogleAuthError, OSError) as exc:
                raise map_api_error(exc) from exc

        return retry(once, self._retry_policy, sleep=self._sleep)

    def _wait(self, zone: str, op: compute_v1.Operation) -> None:
        """Block until the zone operation is DONE; raise the error it finished with.

        ``operations.wait`` returns after at most ~2 minutes even when not done, so it
        is called in a loop bounded by ``operation_timeout``.
        """
        deadline = self._clock() + self._operation_timeout
        while op.status != compute_v1.Operation.Status.DONE:
            if self._clock() > deadline:
                raise TransientError(f"operation {op.name} in {zone} still running", code="OPERATION_TIMEOUT")
            op = self._call(self._operations.wait, project=self.project, zone=zone, operation=op.name)
        if err := operation_error(op):
            raise err

    def _template(self, template_id: str) -> compute_v1.InstanceProperties:
        """The template's properties; cached because instance templates are immutable."""
        if template_id not in self._template_cache:
            project, region, name = parse_template(template_id)
            if region:
                fn, kw = self._region_templates.get, {"region": region}
            else:
                fn, kw = self._global_templates.get, {}
            found = self._call(fn, project=project, instance_template=name, **kw)
            self._template_cache[template_id] = found.properties
        return self._template_cache[template_id]

    def launch(self, req: LaunchRequest) -> Instance:
        request = insert_request(self.project, req, self._template(req.template_id))
        name = request.instance_resource.name
        try:
            op = self._call(self._instances.insert_unary, request=request)
        except ProviderError as exc:
            if exc.code != "alreadyExists":
                raise
        else:
            self._wait(req.zone, op)
        found = self.describe(req.region, instance_id(req.zone, name))
        if found is None:
            # Done without error but gone: a spot VM preempted at birth. Try elsewhere.
            raise CapacityError(f"{name} vanished right after creation", code="VANISHED_AFTER_INSERT")
        return found

    def describe(self, region: str, instance_id: str) -> Instance | None:
        zone, name = split_instance_id(instance_id)
        try:
            data = self._call(self._instances.get, project=self.project, zone=zone, instance=name)
        except ProviderError as exc:
            if _is_not_found(exc):
                return None
            raise
        return instance_from_gce(zone, data)

    def terminate(self, region: str, instance_id: str) -> None:
        zone, name = split_instance_id(instance_id)
        try:
            op = self._call(self._instances.delete_unary, project=self.project, zone=zone, instance=name)
        except ProviderError as exc:
            if _is_not_found(exc):
                return
            raise
        self._wait(zone, op)

    def list_by_tag(self, region: str, tags: Mapping[str, str]) -> list[Instance]:
        request = compute_v1.AggregatedListInstancesRequest(project=self.project, filter=label_filter(tags))
        # The pager fetches further pages lazily; drain it inside the retried call so
        # errors on page 2 are mapped (and retried) like errors on page 1.
        scoped = self._call(lambda: list(self._instances.aggregated_list(request=request)))
        return list(self._in_region(region, scoped))

    @staticmethod
    def _in_region(region: str, scoped: Iterable[tuple[str, Any]]) -> Iterable[Instance]:
        for scope, listing in scoped:
            zone = scope.rsplit("/", 1)[-1]
            if not scope.startswith("zones/") or region_of(zone) != region:
                continue
            for data in listing.instances:
                yield instance_from_gce(zone, data)
