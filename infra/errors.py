"""Typed provider errors and the transient-retry helper.

Every cloud adapter translates its SDK's exceptions into one of these classes so that
the failover policy (``infra.placement.block_for``) can decide *how much* of the world
to avoid next time without knowing anything about boto3 or google-api-core.

Scopes, from narrowest to widest:

``none``    retry the same request later (throttling, 5xx); nothing is blocked.
``zone``    this zone cannot serve this instance type right now (capacity).
``region``  the region is out of quota for this market.
``cloud``   credentials, IAM, networking or an all-regions quota: stop using the cloud.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

Scope = Literal["none", "zone", "region", "cloud"]
SCOPES: tuple[Scope, ...] = ("none", "zone", "region", "cloud")

T = TypeVar("T")


class ProviderError(Exception):
    """A cloud refused or failed a request.

    ``code`` is the cloud's own error code (``InsufficientInstanceCapacity``,
    ``ZONE_RESOURCE_POOL_EXHAUSTED``…) so operators can see it in the failover
    history; ``scope`` is how much to block. Unknown errors default to the zone, the
    cautious choice SkyPilot also makes: try elsewhere, but do not give up on the cloud.
    """

    default_scope: Scope = "zone"

    def __init__(self, message: str, *, code: str = "", scope: Scope | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.scope: Scope = scope or self.default_scope
        if self.scope not in SCOPES:
            raise ValueError(f"unknown scope {self.scope!r}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, scope={self.scope!r}, message={self.message!r})"


class CapacityError(ProviderError):
    """The zone has no capacity for this instance type / market right now."""

    default_scope: Scope = "zone"


class QuotaError(ProviderError):
    """A quota is exhausted: the region's, or (GCP ``GPUS_ALL_REGIONS``) the whole cloud's."""

    default_scope: Scope = "region"


class ConfigError(ProviderError):
    """Our side is wrong: credentials, IAM, VPC, template. Retrying will not help.

    Defaults to the cloud; adapters narrow it to ``region`` when the broken thing is a
    regional resource (a launch template or subnet that exists per region).
    """

    default_scope: Scope = "cloud"


class TransientError(ProviderError):
    """Throttling or a server-side hiccup: retry the same request with backoff."""

    default_scope: Scope = "none"


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter for :class:`TransientError`."""

    attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be >= 1")

    def delay(self, attempt: int, rand: float) -> float:
        """Seconds to wait after failed ``attempt`` (0-based); ``rand`` in [0, 1).

        Full jitter (a uniform draw below the capped exponential) spreads the retries
        of many workers that were throttled at the same moment.
        """
        ceiling = min(self.max_delay, self.base_delay * (2**attempt))
        return ceiling * rand


def retry(
    fn: Callable[[], T],
    policy: RetryPolicy = RetryPolicy(),
    *,
    sleep: Callable[[float], None] = time.sleep,
    rand: Callable[[], float] = random.random,
) -> T:
    """Call ``fn`` and retry it while it raises :class:`TransientError`.

    Only transient errors are retried; every other error (and the last transient one)
    propagates unchanged so the caller's failover logic sees the original code. ``fn``
    must be idempotent; launches are, through their idempotency token.
    """
    for attempt in range(policy.attempts):
        try:
            return fn()
        except TransientError:
            if attempt + 1 >= policy.attempts:
                raise
            sleep(policy.delay(attempt, rand()))
    raise AssertionError("unreachable")  # pragma: no cover
