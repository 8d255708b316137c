"""Provider lookup by cloud name, so callers configure clouds with plain data."""

from __future__ import annotations

from typing import Any

from infra.provider import Provider

CLOUDS = ("aws", "gcp", "local")


def get_provider(cloud: str, **config: Any) -> Provider:
    """Build the provider for ``cloud``; ``config`` goes to its constructor.

    aws:   session=…, endpoint_url=…, template_version=…, or boto3.Session kwargs
           (region_name, aws_access_key_id, profile_name…)
    gcp:   project=… (required), credentials=…, client_options={"api_endpoint": …}
    local: state_dir=… (required), command=[…], env={…}
    """
    # Imported lazily: a control plane that only uses one cloud need not load the
    # other SDKs (google-cloud-compute alone takes ~1 s to import).
    if cloud == "aws":
        from infra.aws import AwsProvider

        return AwsProvider(**config)
    if cloud == "gcp":
        from infra.gcp import GcpProvider

        return GcpProvider(**config)
    if cloud == "local":
        from infra.local import LocalProvider

        return LocalProvider(**config)
    raise ValueError(f"unknown cloud {cloud!r}; expected one of {CLOUDS}")
