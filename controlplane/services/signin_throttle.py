"""Sign-in throttling: exponential backoff, then a temporary lock, after failed sign-ins.

Guarded doors: the console's password and API-key sign-in (``/console/login``), the operator
sign-in with the admin token (``/console/admin/login``), and the bearer credentials of the admin
API (admin token) and the tenant API (API keys), so the console's limits cannot be sidestepped
through the REST API. Machine credentials (edge token, node credentials, bootstrap tokens) are
random 256-bit secrets and are not throttled here.

Failures are counted in three buckets per kind of secret (``password``, ``api_key``,
``admin_token``):

``pair`` (account, client address)
    the tight one: ``free_failures`` failures cost nothing (typos), then each failure makes the
    next try wait ``backoff_base_s`` doubling up to ``backoff_max_s``; failure ``lock_after``
    locks the pair for ``lock_s``, doubling with each further failure up to ``lock_max_s``.
    A success clears it.
``account`` (any address)
    looser (``account_free_failures`` / ``account_lock_after``): a distributed guess at one
    account from many addresses.
``address`` (any account)
    looser (``address_free_failures`` / ``address_lock_after``): one address spraying many
    accounts (or many random API keys).

Lock-out as denial of service: an attacker knows an account's name, not its owner's address. So
the loose buckets never apply to a *known pair*, an (account, address) that signed in
successfully within ``known_pair_s``: the owner keeps signing in from their usual address while
someone else's failures lock the account for everybody else. Only the pair bucket can lock a
known pair, and only failures from that same address fill it. The price: an owner on a new
address during an attack waits out the account lock (the message says so), and a NAT shared with
an attacker shares the pair.

Counting is atomic across API processes: the console *pre-counts* an attempt as a failure before
checking the secret (a burst of parallel guesses cannot all pass the check and fail after it) and
refunds it on success; the REST APIs, whose callers mostly hold valid secrets, only read the
buckets before verifying and count a failure after it. Failures are forgotten gradually after
their wait: one failure leaks away per ``decay_s`` (pair 10 min, account 5 min, address 1 min by
default), so occasional typos never add up, while a guesser past the lock gets about one try
per lock period.

Store: Redis (``NIMBUS_REDIS_URL``), where every API process sees the same counts. Embedded
``make run`` has a private Redis when ``redis-server`` exists; without one (or while Redis is
unreachable) the ``auto`` store counts in this process's memory and retries Redis every
``_RETRY_REDIS_S``: one API process (embedded) loses nothing, several would each allow the limits
once. ``redis`` refuses sign-ins (503) rather than count locally; ``memory`` never uses Redis.
Keys hold SHA-256 digests of account names and addresses, never the names or any secret.

Defaults (``ThrottleSettings``; ``NIMBUS_SIGNIN_THROTTLE`` JSON overrides): pair 3 free failures,
then 1, 2, 4, 8, 16, 30 s, the 10th locks 15 min (then 30, 60 min); account 20 free, locked at 50;
address 30 free, locked at 100; a successful pair stays known 30 days. Accounts: the email
(lower-cased) for passwords, the key's public prefix (``nmb_xxxxxxxx``) for API keys,
``admin`` for the admin token (one set of buckets for the console and the admin API).

Audit (``audit_events``, written by ``api/signin.py``): ``signin.success``, ``signin.failure``
and ``signin.locked`` (the failure that started a lock) with kind, channel, address, account label
(an email only when a tenant holds it, else a digest) and the failure count. An attempt refused
unchecked while backing off or locked is counted in ``nimbus_signin_throttled_total`` rather than
audited, so a flood of refused tries never becomes a flood of database writes.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import Counter
from pydantic import BaseModel, Field

log = logging.getLogger("nimbus.signin")

Kind = Literal["password", "api_key", "admin_token"]
Scope = Literal["pair", "account", "address"]
_RETRY_REDIS_S = 30.0
_MEMORY_MAX_KEYS = 200_000

THROTTLED = Counter("nimbus_signin_throttled_total", "Sign-in attempts refused by throttling, unchecked",
                    ["kind", "scope"])
FAILURES = Counter("nimbus_signin_failures_total", "Failed sign-in attempts", ["kind"])


class ThrottleSettings(BaseModel):
    """``NIMBUS_SIGNIN_THROTTLE`` (JSON) overrides any of these."""

    enabled: bool = True
    store: Literal["auto", "redis", "memory"] = "auto"
    key_prefix: str = Field(default="nimbus:signin:", description="Redis key prefix.")
    free_failures: int = Field(default=3, ge=0, description="Pair: failures before any backoff.")
    backoff_base_s: float = Field(default=1.0, ge=0, description="First backoff; doubles per failure.")
    backoff_max_s: float = Field(default=30.0, ge=0)
    lock_after: int = Field(default=10, ge=1, description="Pair: this failure locks it.")
    lock_s: float = Field(default=900.0, ge=0, description="First lock; doubles per failure after it.")
    lock_max_s: float = Field(default=3600.0, ge=0)
    account_free_failures: int = Field(default=20, ge=0)
    account_lock_after: int = Field(default=50, ge=1)
    address_free_failures: int = Field(default=30, ge=0)
    address_lock_after: int = Field(default=100, ge=1)
    decay_s: float = Field(default=600.0, gt=0, description="Pair: one failure is forgotten per this many seconds "
                           "once its wait is over.")
    account_decay_s: float = Field(default=300.0, gt=0)
    address_decay_s: float = Field(default=60.0, gt=0)
    known_pair_s: float = Field(default=30 * 86400.0, ge=0, description="A successful pair stays known this long.")


@dataclass(frozen=True)
class Limits:
    free: int
    lock_after: int
    base_s: float
    max_backoff_s: float
    lock_s: float
    max_lock_s: float
    decay_s: float

    def failures_now(self, state: dict | None, now: float) -> int:
        """Failures still counted: one leaks away per whole ``decay_s`` after the bucket's wait ended
        (waiting out a backoff or a lock does not itself forgive anything)."""
        if not state:
            return 0
        leaked = math.floor(max(0.0, now - state.get("next", 0.0)) / self.decay_s)
        return max(0, int(state.get("f", 0)) - leaked)

    def wait_after(self, failures: int) -> tuple[float, bool]:
        """(seconds before the next try, whether that is a lock) after ``failures`` failures."""
        if failures >= self.lock_after:
            return min(self.lock_s * 2.0 ** min(failures - self.lock_after, 32), self.max_lock_s), True
        if failures <= self.free:
            return 0.0, False
        return min(self.base_s * 2.0 ** min(failures - self.free - 1, 32), self.max_backoff_s), False


@dataclass(frozen=True)
class Subject:
    """Who is trying: what kind of secret, for which account, from where."""

    kind: Kind
    account: str
    address: str


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after_s: float = 0.0  # blocked: how long until a try is allowed; allowed: the wait if it fails
    locked: bool = False  # the wait is a lock (not a backoff step)
    scope: Scope | None = None  # the bucket that blocks (or would, after a failure)
    failures: int = 0  # the pair's failures, this attempt included when pre-counted
    known_pair: bool = False  # the loose buckets do not apply (a recent success from this address)
    precounted: bool = False  # this attempt already counts as a failure (refunded on success)
    had_pair: bool = False  # the pair bucket held failures when read

    @property
    def retry_after_header(self) -> str:
        return str(max(1, math.ceil(self.retry_after_s)))


class StoreUnavailable(Exception):
    pass


def _h(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _parse(raw: dict | None) -> dict[str, float] | None:
    if not raw:
        return None
    return {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in raw.items()}


Write = tuple[str, str, dict[str, float] | None, float]  # (op "set"|"del", key, mapping, ttl_s)


class _MemoryStore:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._data: dict[str, tuple[float, dict[str, float]]] = {}
        self._lock = asyncio.Lock()
        self._clock = clock

    async def transact(self, keys: list[str], fn: Callable[[list[dict | None]], tuple[Any, list[Write]]]) -> Any:
        async with self._lock:
            now = self._clock()
            states = []
            for key in keys:
                entry = self._data.get(key)
                states.append(dict(entry[1]) if entry and entry[0] > now else None)
            result, writes = fn(states)
            for op, key, mapping, ttl in writes:
                if op == "del":
                    self._data.pop(key, None)
                else:
                    self._data[key] = (now + ttl, dict(mapping or {}))
            if len(self._data) > _MEMORY_MAX_KEYS:
                self._data = {k: v for k, v in self._data.items() if v[0] > now}
                while len(self._data) > _MEMORY_MAX_KEYS:  # still full of live keys: drop the oldest
                    self._data.pop(next(iter(self._data)))
            return result


class _RedisStore:
    """Reads and writes a subject's buckets atomically (WATCH/MULTI, redone on a conflict); a
    read-only look (the REST APIs' check before verifying) is one pipelined round trip."""

    def __init__(self, url: str) -> None:
        import redis.asyncio as aioredis

        self._errors = (OSError, aioredis.ConnectionError, aioredis.TimeoutError)
        self._watch_error = aioredis.WatchError
        self.client = aioredis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=1.0)

    async def read(self, keys: list[str]) -> list[dict | None]:
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hgetall(key)
                return [_parse(raw) for raw in await pipe.execute()]
        except self._errors as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def transact(self, keys: list[str], fn: Callable[[list[dict | None]], tuple[Any, list[Write]]]) -> Any:
        try:
            for _ in range(20):
                async with self.client.pipeline(transaction=True) as pipe:
                    try:
                        await pipe.watch(*keys)
                        states = [_parse(await pipe.hgetall(k)) for k in keys]
                        result, writes = fn(states)
                        if not writes:
                            await pipe.unwatch()
                            return result
                        pipe.multi()
                        for op, key, mapping, ttl in writes:
                            if op == "del":
                                pipe.delete(key)
                            else:
                                pipe.delete(key)
                                pipe.hset(key, mapping=mapping)
                                pipe.pexpire(key, max(1, int(ttl * 1000)))
                        await pipe.execute()
                        return result
                    except self._watch_error:
                        continue  # another process changed a bucket between read and write: redo
            raise StoreUnavailable("sign-in throttle: too much contention on one bucket")
        except self._errors as exc:
            raise StoreUnavailable(str(exc)) from exc


def client_address(peer: str | None) -> str:
    """The caller's address as the throttle keys it. Behind a load balancer the peer is the one
    uvicorn's proxy-headers support took from ``X-Forwarded-For`` (``nimbus api`` enables it; set
    ``FORWARDED_ALLOW_IPS`` to the balancers' addresses, else every client shares theirs). IPv6 is
    keyed by its /64: one host usually holds a whole /64."""
    addr = peer or "unknown"
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return addr[:64]
    if ip.version == 6 and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class SigninThrottle:
    def __init__(self, settings: ThrottleSettings, redis_url: str | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = s = settings
        self.clock = clock
        self.limits: dict[Scope, Limits] = {
            "pair": Limits(s.free_failures, s.lock_after, s.backoff_base_s, s.backoff_max_s, s.lock_s, s.lock_max_s,
                           s.decay_s),
            "account": Limits(s.account_free_failures, s.account_lock_after, s.backoff_base_s, s.backoff_max_s,
                              s.lock_s, s.lock_max_s, s.account_decay_s),
            "address": Limits(s.address_free_failures, s.address_lock_after, s.backoff_base_s, s.backoff_max_s,
                              s.lock_s, s.lock_max_s, s.address_decay_s),
        }
        self._memory = _MemoryStore(clock)
        self._redis = _RedisStore(redis_url) if s.store != "memory" and redis_url else None
        self._redis_down_until = 0.0
        self._warned = False

    # ------------------------------------------------------------------ plumbing
    def _keys(self, sub: Subject) -> list[str]:
        p, k = self.settings.key_prefix, sub.kind
        pair = _h(k, sub.account, sub.address)
        # One hash tag so all four keys share a Redis Cluster slot (a multi-key transaction).
        return [f"{p}{{signin}}:pair:{pair}", f"{p}{{signin}}:acct:{_h(k, sub.account)}",
                f"{p}{{signin}}:addr:{_h(k, sub.address)}", f"{p}{{signin}}:known:{pair}"]

    async def _transact(self, sub: Subject, fn, *, read_only: bool = False) -> Any:
        keys = self._keys(sub)
        if self._redis is not None and time.monotonic() >= self._redis_down_until:
            try:
                if read_only:
                    return fn(await self._redis.read(keys))[0]
                return await self._redis.transact(keys, fn)
            except StoreUnavailable as exc:
                if self.settings.store == "redis":
                    raise
                self._redis_down_until = time.monotonic() + _RETRY_REDIS_S
                # Once at warning level (embedded mode without redis-server meets this on every retry).
                (log.debug if self._warned else log.warning)(
                    "sign-in throttle: Redis unavailable (%s); counting in this process, retrying every %.0f s",
                    exc, _RETRY_REDIS_S)
                self._warned = True
        return await self._memory.transact(keys, fn)

    def _blocking(self, states: list[dict | None], now: float) -> tuple[float, bool, Scope | None]:
        """The longest wait any applicable bucket imposes now."""
        known = states[3] is not None
        wait, locked, scope = 0.0, False, None
        for i, name in enumerate(("pair", "account", "address")):
            if i and known:
                break
            st = states[i]
            if st and st.get("next", 0.0) - now > wait:
                wait, locked, scope = st["next"] - now, bool(st.get("locked")), name
        return wait, locked, scope

    def _count(self, states: list[dict | None], keys: list[str], now: float) -> tuple[list[Write], float, bool,
                                                                                          Scope | None, int]:
        """Writes adding one failure to every applicable bucket, and the wait that failure causes."""
        known = states[3] is not None
        writes: list[Write] = []
        wait, locked, scope, pair_failures = 0.0, False, None, 0
        for i, name in enumerate(("pair", "account", "address")):
            if i and known:
                break
            limits = self.limits[name]
            failures = limits.failures_now(states[i], now) + 1
            d, is_lock = limits.wait_after(failures)
            if i == 0:
                pair_failures = failures
            if d > wait:
                wait, locked, scope = d, is_lock, name
            writes.append(("set", keys[i], {"f": failures, "next": now + d, "locked": int(is_lock)},
                           d + failures * limits.decay_s))
        return writes, wait, locked, scope, pair_failures

    # ------------------------------------------------------------------ the three calls
    async def begin(self, sub: Subject, *, precount: bool) -> Verdict:
        """Before checking a secret. Blocked: refuse without checking it. ``precount``: the attempt
        counts as a failure now (refunded by :meth:`succeeded`); else call :meth:`failed` after."""
        if not self.settings.enabled:
            return Verdict(allowed=True)
        keys = self._keys(sub)

        def fn(states):
            now = self.clock()
            wait, locked, scope = self._blocking(states, now)
            known, had_pair = states[3] is not None, states[0] is not None
            if wait > 0:
                pair_f = self.limits["pair"].failures_now(states[0], now)
                return Verdict(False, wait, locked, scope, pair_f, known, had_pair=had_pair), []
            if not precount:
                return Verdict(True, known_pair=known, had_pair=had_pair), []
            writes, d, is_lock, d_scope, pair_f = self._count(states, keys, now)
            return Verdict(True, d, is_lock, d_scope, pair_f, known, precounted=True, had_pair=True), writes

        verdict = await self._transact(sub, fn, read_only=not precount)
        if not verdict.allowed:
            THROTTLED.labels(sub.kind, verdict.scope or "pair").inc()
        return verdict

    async def failed(self, sub: Subject, begun: Verdict) -> Verdict:
        """After a failed check: counted now unless it was pre-counted; the verdict says what it costs."""
        FAILURES.labels(sub.kind).inc()
        if not self.settings.enabled or begun.precounted:
            return begun
        keys = self._keys(sub)

        def fn(states):
            writes, d, is_lock, scope, pair_f = self._count(states, keys, self.clock())
            return Verdict(True, d, is_lock, scope, pair_f, states[3] is not None), writes

        return await self._transact(sub, fn)

    async def succeeded(self, sub: Subject, begun: Verdict) -> None:
        """After a successful check: the pair is cleared and known; a pre-counted attempt is refunded."""
        if not self.settings.enabled:
            return
        if not (begun.precounted or begun.had_pair or not begun.known_pair):
            return  # a known pair with nothing counted: nothing to write (the common API case)
        keys = self._keys(sub)
        s = self.settings

        def fn(states):
            now = self.clock()
            writes: list[Write] = [("del", keys[0], None, 0.0)] if states[0] else []
            if states[3] is None and s.known_pair_s > 0:
                writes.append(("set", keys[3], {"at": now}, s.known_pair_s))
            if begun.precounted and not begun.known_pair:
                # Pre-counted in the loose buckets too: give that failure back.
                for i, name in ((1, "account"), (2, "address")):
                    st = states[i]
                    if not st:
                        continue
                    limits = self.limits[name]
                    failures = limits.failures_now(st, now) - 1
                    if failures <= 0:
                        writes.append(("del", keys[i], None, 0.0))
                        continue
                    d, is_lock = limits.wait_after(failures)
                    nxt = min(st.get("next", 0.0), now + d)
                    writes.append(("set", keys[i], {"f": failures, "next": nxt, "locked": int(is_lock)},
                                   max(nxt - now, 0.0) + failures * limits.decay_s))
            return None, writes

        await self._transact(sub, fn)

    async def reset(self) -> None:
        """Forgets every bucket (tests, and an operator clearing a lock-out)."""
        self._memory = _MemoryStore(self.clock)
        if self._redis is not None:
            try:
                async for key in self._redis.client.scan_iter(match=f"{self.settings.key_prefix}*", count=500):
                    await self._redis.client.delete(key)
            except self._redis._errors:
                pass

    async def aclose(self) -> None:
        if self._redis is not None:
            await self._redis.client.aclose()
