"""What a new node is told at boot: the agent config inside its cloud-init user data.

The only credential is a one-time bootstrap token (its sha256 is stored on the node row,
the token itself only travels in the user data); everything else is plain
configuration: where the control plane is, which variant to serve with which engine
arguments, and where the artifact cache lives.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.config import Settings
from infra.bootstrap import AgentConfig, render_user_data
from infra.catalog import Catalog
from infra.placement import Candidate


@dataclass(frozen=True)
class VariantSpec:
    """The parts of a model variant a node needs, detached from the ORM session."""

    id: uuid.UUID
    model_name: str
    tier: str
    model_path: str
    quantization: str | None
    gpu_count: int
    engine_args: Mapping[str, Any]


def artifact_source(catalog: Catalog, cloud: str, region: str) -> str | None:
    c = catalog.cloud(cloud)
    return next((r.artifact_bucket for r in (c.regions if c else ()) if r.name == region), None)


def user_data(
    settings: Settings,
    *,
    node_id: uuid.UUID,
    pool_id: uuid.UUID,
    variant: VariantSpec,
    candidate: Candidate,
    catalog: Catalog,
    bootstrap_token: str,
    token_expires_at: dt.datetime,
    now: dt.datetime,
) -> str:
    config = AgentConfig(
        control_plane_url=settings.public_url,
        node_id=str(node_id),
        bootstrap_token=bootstrap_token,
        bootstrap_token_expires_at=token_expires_at,
        variant=str(variant.id),
        # The agent builds the engine command line itself (dataplane/agent/template.py) from the
        # assignment it fetches after registering, over the authenticated channel: variant flags,
        # which may include credentials, never travel in user data. "auto" = SGLang on GPUs.
        engine="auto",
        engine_args=(),
        cluster=settings.cluster_name,
        pool_id=str(pool_id),
        cloud=candidate.cloud,
        region=candidate.region,
        zone=candidate.zone,
        artifact_source=artifact_source(catalog, candidate.cloud, candidate.region),
        labels={"model": variant.model_name, "tier": variant.tier},
    )
    return render_user_data(config, cloud=candidate.cloud, now=now)
