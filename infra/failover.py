"""Walk the candidate list until one launch succeeds, recording every attempt.

This is the loop the control plane's provisioning task runs, kept free of database
and Celery concerns: the caller passes in how to launch on a candidate, persists the
returned attempts (the failover history shown by the admin API) and the new block
entries (the shared blocklist), and applies the result under its lease.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from infra.errors import ProviderError, Scope
from infra.placement import DEFAULT_COOLDOWNS, BlockEntry, Candidate, block_for
from infra.provider import (
    MANAGED_BY,
    MANAGED_BY_VALUE,
    TAG_CLUSTER,
    TAG_NODE_ID,
    Instance,
    InstanceState,
    Provider,
)


def attempt_token(operation_id: str, candidate: Candidate) -> str:
    """The idempotency token for launching ``operation_id`` on ``candidate``.

    Stable when the same attempt is retried (a Celery retry, a worker crash), new for
    every other candidate, and short enough for EC2's 64-character ``ClientToken``.
    """
    c = candidate
    digest = hashlib.sha256(f"{c.cloud}/{c.region}/{c.zone}/{c.instance_type}/{c.spot}".encode()).hexdigest()
    return f"{operation_id[:40]}-{digest[:16]}"


def find_launched(places: Iterable[tuple[Provider, str]], cluster: str, node_id: str) -> Instance | None:
    """A live VM already launched for ``node_id`` in any of the (provider, region) pairs.

    Call this before walking the candidates: if a worker died after the cloud accepted
    a launch but before the result was recorded, the retry adopts that VM instead of
    creating a second one elsewhere (SkyPilot counts by tag for the same reason).
    """
    tags = {MANAGED_BY: MANAGED_BY_VALUE, TAG_CLUSTER: cluster, TAG_NODE_ID: node_id}
    for provider, region in places:
        for instance in provider.list_by_tag(region, tags):
            if instance.state != InstanceState.TERMINATED:
                return instance
    return None


@dataclass(frozen=True)
class Attempt:
    """One try on one candidate: what was asked and what the cloud said."""

    candidate: Candidate
    started_at: datetime
    ok: bool
    error_code: str | None = None
    error_scope: Scope | None = None
    message: str | None = None
    instance_id: str | None = None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form for the operation's history column / admin API."""
        c = self.candidate
        return {
            "cloud": c.cloud,
            "region": c.region,
            "zone": c.zone,
            "instance_type": c.instance_type,
            "spot": c.spot,
            "price": c.price,
            "started_at": self.started_at.isoformat(),
            "ok": self.ok,
            "error_code": self.error_code,
            "error_scope": self.error_scope,
            "message": self.message,
            "instance_id": self.instance_id,
        }


@dataclass
class FailoverResult:
    instance: Instance | None
    attempts: list[Attempt] = field(default_factory=list)
    new_blocks: list[BlockEntry] = field(default_factory=list)

    @property
    def candidate(self) -> Candidate | None:
        """The candidate that succeeded, if any."""
        return next((a.candidate for a in self.attempts if a.ok), None)


def launch_first_available(
    candidates: Sequence[Candidate],
    launch: Callable[[Candidate], Instance],
    now: Callable[[], datetime],
    *,
    cooldown: timedelta | Mapping[Scope, timedelta] = DEFAULT_COOLDOWNS,
    max_attempts: int = 20,
) -> FailoverResult:
    """Try candidates in order; stop at the first success or after ``max_attempts``.

    A failure blocks what its scope says, and later candidates covered by a block made
    during this walk are skipped without calling the cloud (a quota error in a region
    skips that region's other zones). Transient errors that survived the provider's
    retries are recorded and the walk moves on. Non-provider exceptions propagate:
    they are bugs, not capacity.
    """
    result = FailoverResult(instance=None)
    for candidate in candidates:
        if len(result.attempts) >= max_attempts:
            break
        if any(b.covers(candidate) for b in result.new_blocks):
            continue
        started = now()
        try:
            instance = launch(candidate)
        except ProviderError as exc:
            result.attempts.append(Attempt(candidate, started, False, exc.code, exc.scope, exc.message[:500]))
            if block := block_for(exc, candidate, now(), cooldown):
                result.new_blocks.append(block)
            continue
        result.attempts.append(Attempt(candidate, started, True, instance_id=instance.instance_id))
        result.instance = instance
        break
    return result
