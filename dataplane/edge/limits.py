"""Per-tenant limits: requests/min, tokens/min, concurrent requests, monthly token budget.

Windows are sliding-window counters (this minute's count + last minute's × the share of it still
inside the window). Tokens are *reserved* on admission (prompt estimate + max_tokens) and
reconciled with the real usage on completion. The authoritative store is Redis, where one Lua
script checks and commits everything atomically, so many edges share one budget. If Redis is
unreachable the edge switches to a per-instance in-memory store with the same semantics
(``limits_fail_mode="closed"``, optionally scaled by ``local_limit_share``) or admits everything
(``"open"``); either way no request fails because Redis did.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from dataplane.edge import errors
from dataplane.edge.catalog import Limits, Tenant

log = logging.getLogger("nimbus.edge.limits")

WINDOW_S = 60
CONCURRENCY_TTL_S = 600  # a crashed edge's concurrency slots free themselves after this
OK, REQUESTS, TOKENS, CONCURRENCY, BUDGET = "ok", "requests", "tokens", "concurrency", "budget"


@dataclass(slots=True)
class Counts:
    """What a store saw when it decided (before this request's own increment)."""

    verdict: str
    req_cur: float = 0
    req_prev: float = 0
    tok_cur: float = 0
    tok_prev: float = 0
    concurrent: int = 0
    month_used: int = 0


@dataclass(slots=True)
class Lease:
    """What an admitted request holds, to give back or reconcile when it finishes."""

    tenant_id: str
    request_id: str
    window: int
    month: str
    reserved_tokens: int
    store: str  # "redis" | "local" | "none"


@dataclass(slots=True)
class Decision:
    allowed: bool
    reason: str
    headers: dict[str, str] = field(default_factory=dict)
    retry_after_s: float = 0.0
    lease: Lease | None = None


def window_of(now: float) -> tuple[int, float]:
    """(window number, fraction of it elapsed)."""
    return int(now // WINDOW_S), (now % WINDOW_S) / WINDOW_S


def month_of(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y%m")


def sliding(cur: float, prev: float, frac: float) -> float:
    return cur + prev * (1.0 - frac)


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: ``1s``, ``6m0s``, ``250ms``."""
    if seconds < 1:
        return f"{max(0, int(seconds * 1000))}ms"
    s = math.ceil(seconds)
    minutes, s = divmod(s, 60)
    return f"{minutes}m{s}s" if minutes else f"{s}s"


def wait_for_room(cur: float, prev: float, frac: float, need: float, limit: float) -> float:
    """Seconds until the sliding estimate leaves room for ``need`` more units under ``limit``."""
    if cur + need > limit:
        # Even with last minute fully gone this minute is too full: wait for the window to roll,
        # then for this minute's share to decay enough.
        rest = (1.0 - frac) * WINDOW_S
        if cur <= 0:
            return rest
        share_needed = (cur + need - limit) / cur  # of next window that must pass
        return rest + max(0.0, min(1.0, share_needed)) * WINDOW_S
    if prev <= 0:
        return 0.0
    # est(t) = cur + prev * (1 - frac - t/W) must drop to limit - need
    t = ((cur + prev * (1.0 - frac)) - (limit - need)) / prev * WINDOW_S
    return max(0.0, min(t, (1.0 - frac) * WINDOW_S))


def scaled(limits: Limits, share: float) -> Limits:
    def f(v: int | None) -> int | None:
        return None if v is None else max(1, int(v * share))
    return Limits(f(limits.requests_per_minute), f(limits.tokens_per_minute), f(limits.max_concurrent_requests),
                  limits.monthly_token_budget, limits.monthly_tokens_used)


def decide(limits: Limits, counts: Counts, reserve: int, now: float, lease: Lease | None) -> Decision:
    """Turn a store's verdict and counts into headers, retry-after and the error to raise."""
    _, frac = window_of(now)
    headers: dict[str, str] = {}
    reset_window = (1.0 - frac) * WINDOW_S
    req_est = sliding(counts.req_cur, counts.req_prev, frac)
    tok_est = sliding(counts.tok_cur, counts.tok_prev, frac)
    admitted = counts.verdict == OK
    if limits.requests_per_minute is not None:
        rpm = limits.requests_per_minute
        headers["x-ratelimit-limit-requests"] = str(rpm)
        headers["x-ratelimit-remaining-requests"] = str(max(0, int(rpm - req_est - (1 if admitted else 0))))
        headers["x-ratelimit-reset-requests"] = format_duration(
            wait_for_room(counts.req_cur, counts.req_prev, frac, 1, rpm) if not admitted else reset_window)
    if limits.tokens_per_minute is not None:
        tpm = limits.tokens_per_minute
        headers["x-ratelimit-limit-tokens"] = str(tpm)
        headers["x-ratelimit-remaining-tokens"] = str(max(0, int(tpm - tok_est - (reserve if admitted else 0))))
        headers["x-ratelimit-reset-tokens"] = format_duration(
            wait_for_room(counts.tok_cur, counts.tok_prev, frac, reserve, tpm) if not admitted else reset_window)
    if admitted:
        return Decision(True, OK, headers, lease=lease)
    if counts.verdict == BUDGET:
        headers["x-should-retry"] = "false"
        return Decision(False, BUDGET, headers)
    if counts.verdict == REQUESTS:
        wait = wait_for_room(counts.req_cur, counts.req_prev, frac, 1, limits.requests_per_minute or 0)
    elif counts.verdict == TOKENS:
        wait = wait_for_room(counts.tok_cur, counts.tok_prev, frac, reserve, limits.tokens_per_minute or 0)
    else:  # concurrency: a slot frees when a request finishes; suggest a short wait
        wait = 1.0
    wait = max(1.0, wait)
    headers["retry-after"] = str(math.ceil(wait))
    headers["retry-after-ms"] = str(int(wait * 1000))
    return Decision(False, counts.verdict, headers, retry_after_s=wait)


def to_error(decision: Decision) -> errors.EdgeError:
    messages = {
        REQUESTS: ("Rate limit reached for requests per minute.", "rate_limit_exceeded", "requests"),
        TOKENS: ("Rate limit reached for tokens per minute.", "rate_limit_exceeded", "tokens"),
        CONCURRENCY: ("Too many concurrent requests for this tenant.", "rate_limit_exceeded", "concurrency"),
        BUDGET: ("The tenant's monthly token budget is exhausted.", "insufficient_quota", "insufficient_quota"),
    }
    message, type_, code = messages[decision.reason]
    return errors.EdgeError(429, message, type=type_, code=code, headers=decision.headers)


# ---------------------------------------------------------------- stores


class LocalStore:
    """In-memory store with the Redis script's semantics; per edge instance."""

    name = "local"

    def __init__(self) -> None:
        self.counters: dict[str, float] = {}
        self.concurrent: dict[str, dict[str, float]] = {}

    def _get(self, key: str) -> float:
        return self.counters.get(key, 0.0)

    def admit(self, tenant_id: str, limits: Limits, request_id: str, reserve: int, now: float) -> Counts:
        window, frac = window_of(now)
        month = month_of(now)
        rk, tk, mk = f"{tenant_id}:r:", f"{tenant_id}:t:", f"{tenant_id}:m:{month}"
        counts = Counts(OK, self._get(rk + str(window)), self._get(rk + str(window - 1)),
                        self._get(tk + str(window)), self._get(tk + str(window - 1)))
        slots = self.concurrent.setdefault(tenant_id, {})
        for rid, at in list(slots.items()):
            if at < now - CONCURRENCY_TTL_S:
                del slots[rid]
        counts.concurrent = len(slots)
        counts.month_used = max(limits.monthly_tokens_used, int(self._get(mk)))
        counts.verdict = _verdict(limits, counts, reserve, frac)
        if counts.verdict == OK:
            self.counters[rk + str(window)] = counts.req_cur + 1
            self.counters[tk + str(window)] = counts.tok_cur + reserve
            if limits.max_concurrent_requests is not None:
                slots[request_id] = now
            self._gc(window)
        return counts

    def settle(self, lease: Lease, actual_tokens: int) -> None:
        key = f"{lease.tenant_id}:t:{lease.window}"
        if key in self.counters:
            self.counters[key] = max(0.0, self.counters[key] + actual_tokens - lease.reserved_tokens)
        mk = f"{lease.tenant_id}:m:{lease.month}"
        self.counters[mk] = self._get(mk) + actual_tokens
        self.concurrent.get(lease.tenant_id, {}).pop(lease.request_id, None)

    def _gc(self, window: int) -> None:
        if len(self.counters) > 100_000:
            for key in list(self.counters):
                _, _, win = key.rpartition(":")
                if ":m:" not in key and win.isdigit() and int(win) < window - 1:
                    del self.counters[key]


def _verdict(limits: Limits, c: Counts, reserve: int, frac: float) -> str:
    """The single decision rule; ``LUA_ADMIT`` mirrors it line by line."""
    if limits.monthly_token_budget is not None and c.month_used >= limits.monthly_token_budget:
        return BUDGET
    if limits.requests_per_minute is not None and sliding(c.req_cur, c.req_prev, frac) + 1 > limits.requests_per_minute:
        return REQUESTS
    if limits.tokens_per_minute is not None:
        used = sliding(c.tok_cur, c.tok_prev, frac)
        # A single request larger than the whole limit may still run alone in an empty window.
        if used > 0 and used + reserve > limits.tokens_per_minute:
            return TOKENS
    if limits.max_concurrent_requests is not None and c.concurrent >= limits.max_concurrent_requests:
        return CONCURRENCY
    return OK


LUA_ADMIT = """
-- KEYS: req_cur req_prev tok_cur tok_prev conc month
-- ARGV: now frac rpm tpm conc_limit budget budget_used reserve request_id conc_ttl   (-1 = no limit)
local now, frac = tonumber(ARGV[1]), tonumber(ARGV[2])
local rpm, tpm, climit, budget = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local reserve = tonumber(ARGV[8])
local rc = tonumber(redis.call('GET', KEYS[1]) or '0')
local rp = tonumber(redis.call('GET', KEYS[2]) or '0')
local tc = tonumber(redis.call('GET', KEYS[3]) or '0')
local tp = tonumber(redis.call('GET', KEYS[4]) or '0')
local used = math.max(tonumber(ARGV[7]), tonumber(redis.call('GET', KEYS[6]) or '0'))
local conc = 0
if climit >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - tonumber(ARGV[10]))
  conc = redis.call('ZCARD', KEYS[5])
end
local verdict = 'ok'
if budget >= 0 and used >= budget then verdict = 'budget'
elseif rpm >= 0 and rc + rp * (1 - frac) + 1 > rpm then verdict = 'requests'
elseif tpm >= 0 and (tc + tp * (1 - frac)) > 0 and (tc + tp * (1 - frac)) + reserve > tpm then verdict = 'tokens'
elseif climit >= 0 and conc >= climit then verdict = 'concurrency'
end
if verdict == 'ok' then
  redis.call('INCR', KEYS[1]); redis.call('EXPIRE', KEYS[1], 130)
  redis.call('INCRBY', KEYS[3], reserve); redis.call('EXPIRE', KEYS[3], 130)
  if climit >= 0 then
    redis.call('ZADD', KEYS[5], now, ARGV[9]); redis.call('EXPIRE', KEYS[5], tonumber(ARGV[10]))
  end
end
return {verdict, tostring(rc), tostring(rp), tostring(tc), tostring(tp), conc, used}
"""

LUA_SETTLE = """
-- KEYS: tok_window conc month ; ARGV: delta request_id actual
if redis.call('EXISTS', KEYS[1]) == 1 then
  local v = redis.call('INCRBY', KEYS[1], ARGV[1])
  if v < 0 then redis.call('SET', KEYS[1], 0, 'KEEPTTL') end
end
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('INCRBY', KEYS[3], ARGV[3]); redis.call('EXPIRE', KEYS[3], 3024000)
return 1
"""


def _nz(v: int | None) -> int:
    return -1 if v is None else v


class RedisStore:
    name = "redis"

    def __init__(self, client, prefix: str = "nimbus:") -> None:
        self.client = client
        self.prefix = prefix + "rl:"
        self._admit = client.register_script(LUA_ADMIT)
        self._settle = client.register_script(LUA_SETTLE)

    def _keys(self, tenant_id: str, window: int, month: str) -> list[str]:
        p = f"{self.prefix}{{{tenant_id}}}:"  # hash tag: one tenant's keys share a cluster slot
        return [f"{p}r:{window}", f"{p}r:{window - 1}", f"{p}t:{window}", f"{p}t:{window - 1}", f"{p}c",
                f"{p}m:{month}"]

    async def admit(self, tenant_id: str, limits: Limits, request_id: str, reserve: int, now: float) -> Counts:
        window, frac = window_of(now)
        month = month_of(now)
        res = await self._admit(
            keys=self._keys(tenant_id, window, month),
            args=[now, frac, _nz(limits.requests_per_minute), _nz(limits.tokens_per_minute),
                  _nz(limits.max_concurrent_requests), _nz(limits.monthly_token_budget),
                  limits.monthly_tokens_used, reserve, request_id, CONCURRENCY_TTL_S],
        )
        verdict = res[0].decode() if isinstance(res[0], bytes) else res[0]
        return Counts(verdict, float(res[1]), float(res[2]), float(res[3]), float(res[4]), int(res[5]), int(res[6]))

    async def settle(self, lease: Lease, actual_tokens: int) -> None:
        keys = self._keys(lease.tenant_id, lease.window, lease.month)
        await self._settle(keys=[keys[2], keys[4], keys[5]],
                           args=[actual_tokens - lease.reserved_tokens, lease.request_id, actual_tokens])


class Limiter:
    """Chooses the store: Redis while it answers, the local store (or nothing) while it does not."""

    def __init__(self, redis_store: RedisStore | None, fail_mode: str = "closed", local_share: float = 1.0,
                 retry_s: float = 1.0, clock=time.time, monotonic=time.monotonic) -> None:
        self.redis = redis_store
        self.local = LocalStore()
        self.fail_mode = fail_mode
        self.local_share = local_share
        self.retry_s = retry_s
        self.clock = clock
        self.monotonic = monotonic
        self.redis_down_until = 0.0

    @property
    def redis_usable(self) -> bool:
        return self.redis is not None and self.monotonic() >= self.redis_down_until

    def _redis_failed(self, exc: BaseException) -> None:
        if self.monotonic() >= self.redis_down_until:
            log.warning("redis unreachable for limits (%r); using %s limits for %.1fs", exc,
                        "local" if self.fail_mode == "closed" else "no", self.retry_s)
        self.redis_down_until = self.monotonic() + self.retry_s

    async def admit(self, tenant: Tenant, request_id: str, reserve: int) -> Decision:
        limits = tenant.limits
        if limits.unlimited:
            return Decision(True, OK, lease=None)
        now = self.clock()
        window, _ = window_of(now)
        month = month_of(now)
        if self.redis_usable:
            try:
                counts = await self.redis.admit(tenant.id, limits, request_id, reserve, now)  # type: ignore[union-attr]
                lease = Lease(tenant.id, request_id, window, month, reserve, "redis")
                return decide(limits, counts, reserve, now, lease)
            except Exception as exc:  # any Redis failure means: go local, never fail the request
                self._redis_failed(exc)
        if self.fail_mode == "open":
            return Decision(True, OK, lease=None)
        local_limits = scaled(limits, self.local_share)
        counts = self.local.admit(tenant.id, local_limits, request_id, reserve, now)
        return decide(local_limits, counts, reserve, now, Lease(tenant.id, request_id, window, month, reserve,
                                                                 "local"))

    async def settle(self, lease: Lease | None, actual_tokens: int) -> None:
        if lease is None:
            return
        if lease.store == "local":
            self.local.settle(lease, actual_tokens)
            return
        try:
            await self.redis.settle(lease, actual_tokens)  # type: ignore[union-attr]
        except Exception as exc:
            # The reservation stays counted until its window ends and the slot expires: safe side.
            self._redis_failed(exc)
