"""What a new node is told at boot: the agent config inside its cloud-init user data.

The only credential is a one-time bootstrap token (its sha256 is stored on the node row,
the token itself only travels in the user data); everything else is plain
configuration: where the control plane is, which cloud, region and zone the node is in, and
where the artifact cache lives. Which replicas to run comes later, over the agent API.
"""

from __future__ import annotations

import datetime as dt
import uuid

from controlplane.config import Settings
from infra.bootstrap import AgentConfig, render_user_data
from infra.catalog import Catalog
from infra.placement import Candidate


def artifact_source(catalog: Catalog, cloud: str, region: str) -> str | None:
    c = catalog.cloud(cloud)
    return next((r.artifact_bucket for r in (c.regions if c else ()) if r.name == region), None)


def user_data(
    settings: Settings,
    *,
    node_id: uuid.UUID,
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
        # A node hosts replicas of any pool: the agent learns which (and builds each engine's
        # command line itself, dataplane/agent/template.py) from the replica list it fetches after
        # registering, over the authenticated channel. Variant flags, which may include
        # credentials, never travel in user data. "auto" = SGLang on GPUs.
        variant="",
        engine="auto",
        engine_args=(),
        cluster=settings.cluster_name,
        cloud=candidate.cloud,
        region=candidate.region,
        zone=candidate.zone,
        artifact_source=artifact_source(catalog, candidate.cloud, candidate.region),
        labels={"instance_type": candidate.instance_type, "market": "spot" if candidate.spot else "on_demand"},
    )
    return render_user_data(config, cloud=candidate.cloud, now=now)
