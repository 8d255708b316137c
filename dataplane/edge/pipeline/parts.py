"""What the stages read from the edge that runs them: its shared parts, as an interface.

``EdgeService`` is the one implementation. The stages name this protocol rather than the
service, so the pipeline depends on what it uses and the service on the pipeline, not both ways.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, Protocol

from dataplane.edge.admission import Admission
from dataplane.edge.catalog import Catalog
from dataplane.edge.fairness import RollingPeak, ShareGuards
from dataplane.edge.limits import Limiter
from dataplane.edge.metrics import EdgeMetrics
from dataplane.edge.prefix import PrefixIndex
from dataplane.edge.response_cache import ResponseCache, SharedResponseCache
from dataplane.edge.router import Router
from dataplane.edge.semantic_cache import SemanticCache
from dataplane.edge.settings import EdgeSettings
from dataplane.edge.signals import SignalRecorder
from dataplane.edge.upstream import UpstreamClient
from dataplane.edge.usage import UsageRecorder
from dataplane.edge.validation import TokenEstimator


class EdgeParts(Protocol):
    settings: EdgeSettings
    metrics: EdgeMetrics
    catalog: Catalog | None
    catalog_changed: asyncio.Event  # set (and replaced) on every new snapshot
    source: Any  # the snapshot source: ``activate(pool_id, variant_id)`` asks for replicas
    estimator: TokenEstimator
    extra_fields: frozenset[str]
    index: PrefixIndex
    router: Router
    admission: Admission
    signals: SignalRecorder
    response_cache: ResponseCache | SharedResponseCache
    semantic: SemanticCache | None
    limiter: Limiter
    usage: UsageRecorder | None
    upstream: UpstreamClient
    # What the stages keep between requests.
    share_guards: ShareGuards  # admit: the fair-share guard of each variant
    interactive_peaks: dict[str, RollingPeak]  # route: per variant, what batch work leaves free
    activation_sent: dict[str, float]  # admit: per pool, when the edge last asked for a replica

    def current_catalog(self) -> Catalog:
        """The snapshot, or 503 ``not_ready`` before the first one."""

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` in the background; the edge waits for it when it stops."""
