"""Sign-in throttling: the policy (backoff, lock, decay, known pairs) on both stores, and its
doors over real HTTP (uvicorn): the admin API's bearer token, the tenant API's keys and the
console's password, key and admin-token forms; 429 + Retry-After, the audit trail, state shared
by two API processes through Redis, and the in-process fallback without Redis.

Addresses: uvicorn trusts X-Forwarded-For from 127.0.0.1 (its proxy-headers default, as under
``nimbus api``), so each request's X-Forwarded-For picks the client address the throttle sees. Every test has its own Redis key prefix (conftest)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid

import httpx
import pytest
import redis

from controlplane.api.app import create_app
from controlplane.api.signin import client_address
from controlplane.config import Settings
from controlplane.services.signin_throttle import SigninThrottle, Subject, ThrottleSettings
from tests.controlplane.conftest import ADMIN_TOKEN, isolated_throttle
from tests.live_server import serve

# Async fixtures run on the session loop (pyproject); the Redis clients must stay on one loop.
on_session_loop = pytest.mark.asyncio(loop_scope="session")

REDIS_URL = "redis://127.0.0.1:6379/0"
PASSWORD = "correct horse battery staple"
_CSRF = re.compile(r'name="_csrf" value="([^"]+)"')


# ---------------------------------------------------------------- the policy, on both stores
class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=["memory", "redis"])
async def policy(request):
    clock = Clock()
    throttle = SigninThrottle(isolated_throttle(store=request.param), REDIS_URL, clock=clock)
    yield throttle, clock
    await throttle.reset()
    await throttle.aclose()


async def _fail(throttle: SigninThrottle, sub: Subject):
    begun = await throttle.begin(sub, precount=True)
    if not begun.allowed:
        return begun
    return await throttle.failed(sub, begun)


@on_session_loop
async def test_backoff_doubles_then_locks_then_lock_doubles(policy) -> None:
    throttle, clock = policy
    sub = Subject("password", "a@example.com", "192.0.2.1")
    waits = []
    for _ in range(13):
        verdict = await _fail(throttle, sub)
        assert verdict.allowed, verdict
        waits.append((verdict.retry_after_s, verdict.locked))
        clock.t += verdict.retry_after_s  # wait exactly as told
    assert waits == [(0, False)] * 3 + [(1, False), (2, False), (4, False), (8, False), (16, False), (30, False),
                                        (900, True), (1800, True), (3600, True), (3600, True)]
    # Trying again before the wait is over is refused without counting.
    clock.t -= 1
    refused = await throttle.begin(sub, precount=True)
    assert not refused.allowed and refused.locked and refused.retry_after_s == pytest.approx(1)
    assert refused.failures == 13


@on_session_loop
async def test_failures_leak_away_after_the_wait_and_success_clears_the_pair(policy) -> None:
    throttle, clock = policy
    sub = Subject("admin_token", "admin", "192.0.2.2")
    for _ in range(5):
        verdict = await _fail(throttle, sub)
        clock.t += verdict.retry_after_s
    assert verdict.retry_after_s == 2  # 5th failure: 2 s
    clock.t += 3 * 600  # three pair failures forgotten (one per 10 min)
    assert (await _fail(throttle, sub)).retry_after_s == 0  # 5 - 3 + 1 = 3: free again
    begun = await throttle.begin(sub, precount=True)
    await throttle.succeeded(sub, begun)
    for _ in range(3):
        assert (await _fail(throttle, sub)).retry_after_s == 0  # cleared: three free failures again


@on_session_loop
async def test_loose_buckets_spare_known_pairs(policy) -> None:
    throttle, clock = policy
    owner = Subject("password", "owner@example.com", "192.0.2.10")
    begun = await throttle.begin(owner, precount=True)
    await throttle.succeeded(owner, begun)  # the owner's usual address is now a known pair
    for i in range(50):  # a distributed guess: 50 addresses, one failure each, waiting out each backoff
        verdict = await _fail(throttle, Subject("password", "owner@example.com", f"198.51.100.{i}"))
        assert verdict.allowed
        clock.t += verdict.retry_after_s if not verdict.locked else 0
    stranger = await throttle.begin(Subject("password", "owner@example.com", "203.0.113.99"), precount=True)
    assert not stranger.allowed and stranger.locked and stranger.scope == "account"
    assert stranger.retry_after_s == pytest.approx(900)
    again = await throttle.begin(owner, precount=True)
    assert again.allowed and again.known_pair  # the owner signs in regardless


@on_session_loop
async def test_one_address_spraying_accounts_is_locked(policy) -> None:
    throttle, clock = policy
    for i in range(100):
        verdict = await _fail(throttle, Subject("api_key", f"nmb_{i:08d}", "192.0.2.77"))
        clock.t += verdict.retry_after_s if verdict.retry_after_s < 100 else 0
    assert verdict.locked and verdict.scope == "address"
    refused = await throttle.begin(Subject("api_key", "nmb_fresh000", "192.0.2.77"), precount=False)
    assert not refused.allowed and refused.scope == "address"
    other = await throttle.begin(Subject("api_key", "nmb_fresh000", "192.0.2.78"), precount=False)
    assert other.allowed


@on_session_loop
async def test_redis_holds_digests_never_account_names() -> None:
    settings = isolated_throttle(store="redis")
    throttle = SigninThrottle(settings, REDIS_URL)
    try:
        await _fail(throttle, Subject("password", "victim@example.com", "192.0.2.5"))
        r = redis.Redis.from_url(REDIS_URL)
        keys = list(r.scan_iter(match=settings.key_prefix + "*"))
        assert len(keys) == 3  # pair, account, address
        dump = b" ".join(keys + [b" ".join(f"{k}={v}".encode() for k, v in r.hgetall(key).items()) for key in keys])
        assert b"victim" not in dump and b"192.0.2.5" not in dump
    finally:
        await throttle.reset()
        await throttle.aclose()


def test_client_address_rules() -> None:
    assert client_address("203.0.113.1") == "203.0.113.1"
    assert client_address("2001:db8:1:2:3:4:5:6") == "2001:db8:1:2::/64"  # one host, one /64
    assert client_address("::ffff:192.0.2.9") == "192.0.2.9"
    assert client_address(None) == "unknown"


# ---------------------------------------------------------------- over HTTP
def _settings(settings: Settings, **throttle) -> Settings:
    return settings.model_copy(update={"signin_throttle": isolated_throttle(**throttle)})


def _login(client: httpx.Client, path: str, address: str, **fields) -> httpx.Response:
    """A console sign-in form post from ``address`` (the login CSRF cookie is sent by hand: it is
    Secure, and these servers are plain http on loopback)."""
    page = client.get(path, headers={"X-Forwarded-For": address})
    token = _CSRF.search(page.text).group(1)
    return client.post(path, data={"_csrf": token, **fields}, follow_redirects=False,
                       headers={"X-Forwarded-For": address,
                                "Cookie": f"nimbus_login_csrf={page.cookies['nimbus_login_csrf']}"})


def _admin(address: str, token: str = ADMIN_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "X-Forwarded-For": address}


def _tenant(c: httpx.Client, email: str | None = None) -> tuple[dict, str]:
    body = {"name": f"t-{uuid.uuid4().hex[:8]}"} | ({"email": email, "password": PASSWORD} if email else {})
    tenant = c.post("/admin/v1/tenants", json=body, headers=_admin("192.0.2.200")).json()
    key = c.post(f"/admin/v1/tenants/{tenant['id']}/keys", json={"scopes": ["inference", "manage"]},
                 headers=_admin("192.0.2.200")).json()
    return tenant, key["secret"]


def _audit(c: httpx.Client, action: str) -> list[dict]:
    page = c.get(f"/admin/v1/audit?action={action}&limit=200", headers=_admin("192.0.2.200"))
    assert page.status_code == 200, page.text
    return page.json()["items"]


def test_admin_api_backs_off_with_429_retry_after_and_audits(settings) -> None:
    app = create_app(_settings(settings, free_failures=2, backoff_base_s=20, lock_after=5))
    bad = "wrong-admin-token-guess"
    with serve(app) as url, httpx.Client(base_url=url) as c:
        attacker = "203.0.113.7"
        for _ in range(3):
            r = c.get("/admin/v1/tenants", headers=_admin(attacker, bad))
            assert r.status_code == 401
        # The third failure cost a 20 s wait: even the right token is refused from that address now.
        r = c.get("/admin/v1/tenants", headers=_admin(attacker))
        assert r.status_code == 429, r.text
        assert 15 <= int(r.headers["Retry-After"]) <= 20
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["status"] == 429 and "wait" in r.json()["detail"]
        # Another address is not affected.
        assert c.get("/admin/v1/tenants", headers=_admin("198.51.100.9")).status_code == 200
        rows = _audit(c, "signin.failure")
        mine = [a for a in rows if a["after"]["address"] == attacker]
        assert len(mine) == 3
        assert {(a["after"]["kind"], a["after"]["channel"], a["actor"]) for a in mine} == {
            ("admin_token", "api", f"anonymous@{attacker}")}
        assert [a["after"]["failures"] for a in sorted(mine, key=lambda a: a["at"])] == [1, 2, 3]
        assert bad not in json.dumps(rows) and ADMIN_TOKEN not in json.dumps(rows)


def test_console_password_lock_message_429_and_audit(settings) -> None:
    app = create_app(_settings(settings, free_failures=1, backoff_base_s=0.05, backoff_max_s=0.05,
                               lock_after=3, lock_s=120))
    with serve(app) as url, httpx.Client(base_url=url) as c:
        tenant, _ = _tenant(c, "lock@example.com")
        here = "203.0.113.20"
        first = _login(c, "/console/login", here, method="password", email="lock@example.com", password="nope-1")
        assert first.status_code == 401 and "did not work" in first.text and "Wait" not in first.text
        second = _login(c, "/console/login", here, method="password", email="lock@example.com", password="nope-2")
        assert second.status_code == 401 and "Wait 1 second before the next try" in second.text
        time.sleep(0.1)
        third = _login(c, "/console/login", here, method="password", email="lock@example.com", password="nope-3")
        assert third.status_code == 401 and "locked for 2 minutes" in third.text
        # Locked: the right password is not even checked.
        locked = _login(c, "/console/login", here, method="password", email="lock@example.com", password=PASSWORD)
        assert locked.status_code == 429
        assert 100 <= int(locked.headers["Retry-After"]) <= 120
        assert 'id="login-error" data-throttled="true"' in locked.text and "locked for 2 minutes" in locked.text
        assert "nimbus_console=" not in locked.headers.get("set-cookie", "")
        # Another address signs in with the right password.
        ok = _login(c, "/console/login", "198.51.100.20", method="password", email="lock@example.com",
                    password=PASSWORD)
        assert ok.status_code == 303
        failures = _audit(c, "signin.failure")
        assert len(failures) == 3
        assert all(a["tenant_id"] == tenant["id"] and a["after"]["account"] == "lock@example.com"
                   and a["after"]["kind"] == "password" and a["after"]["channel"] == "console" for a in failures)
        locks = _audit(c, "signin.locked")
        assert len(locks) == 1 and locks[0]["after"]["scope"] == "pair" and locks[0]["after"]["locked_for_s"] == 120
        success = _audit(c, "signin.success")
        assert [a["after"]["address"] for a in success] == ["198.51.100.20"]
        dump = json.dumps(failures + locks + success)
        assert "nope-" not in dump and PASSWORD not in dump


def test_others_failures_do_not_lock_the_owner_out(settings) -> None:
    app = create_app(_settings(settings, free_failures=5, account_free_failures=2, account_lock_after=4,
                               backoff_base_s=0, lock_s=300))
    with serve(app) as url, httpx.Client(base_url=url) as c:
        _tenant(c, "owner@example.com")
        home = "192.0.2.50"
        assert _login(c, "/console/login", home, method="password", email="owner@example.com",
                      password=PASSWORD).status_code == 303
        for i in range(5):  # five attacker addresses, one guess each
            r = _login(c, "/console/login", f"198.51.100.{60 + i}", method="password", email="owner@example.com",
                       password=f"guess-{i}")
            assert r.status_code in (401, 429)
        stranger = _login(c, "/console/login", "203.0.113.61", method="password", email="owner@example.com",
                          password=PASSWORD)
        assert stranger.status_code == 429 and "addresses it has not signed in from" in stranger.text
        owner = _login(c, "/console/login", home, method="password", email="owner@example.com", password=PASSWORD)
        assert owner.status_code == 303 and owner.headers["location"] == "/console/dashboard"
        # Unknown email: the audit row names a digest, not what was typed.
        _login(c, "/console/login", home, method="password", email="typo-or-password@example.com", password="x")
        unknown = [a for a in _audit(c, "signin.failure") if a["after"]["account"].startswith("unknown:")]
        assert len(unknown) == 1 and "typo" not in json.dumps(unknown)


def test_parallel_guesses_cannot_all_pass(settings) -> None:
    app = create_app(_settings(settings, free_failures=2, backoff_base_s=30))

    async def burst(url: str) -> list[int]:
        async with httpx.AsyncClient(base_url=url) as ac:
            forms = []
            for _ in range(12):
                page = await ac.get("/console/login")
                forms.append((_CSRF.search(page.text).group(1), page.cookies["nimbus_login_csrf"]))
            answers = await asyncio.gather(*(
                ac.post("/console/login", data={"_csrf": tok, "method": "password", "email": "p@example.com",
                                                "password": f"guess-{i}"},
                        headers={"Cookie": f"nimbus_login_csrf={cookie}", "X-Forwarded-For": "203.0.113.30"})
                for i, (tok, cookie) in enumerate(forms)))
            return sorted(a.status_code for a in answers)

    with serve(app) as url, httpx.Client(base_url=url) as c:
        _tenant(c, "p@example.com")
        # Two free failures and the one that starts the 30 s backoff are checked; the rest never are.
        assert asyncio.run(burst(url)) == [401] * 3 + [429] * 9


def test_two_api_processes_share_the_counts(settings) -> None:
    shared = _settings(settings, free_failures=1, backoff_base_s=30)
    with serve(create_app(shared)) as one, serve(create_app(shared)) as two:
        with httpx.Client(base_url=one) as c1, httpx.Client(base_url=two) as c2:
            assert c1.get("/admin/v1/tenants", headers=_admin("203.0.113.40", "bad-1")).status_code == 401
            assert c1.get("/admin/v1/tenants", headers=_admin("203.0.113.40", "bad-2")).status_code == 401
            r = c2.get("/admin/v1/tenants", headers=_admin("203.0.113.40", "bad-3"))
            assert r.status_code == 429 and int(r.headers["Retry-After"]) > 20


def test_tenant_api_keys_throttled_known_pairs_spared(settings) -> None:
    app = create_app(_settings(settings, address_free_failures=2, address_lock_after=4, backoff_base_s=0,
                               lock_s=300))
    with serve(app) as url, httpx.Client(base_url=url) as c:
        tenant, secret = _tenant(c)
        spare = c.post(f"/admin/v1/tenants/{tenant['id']}/keys", json={"scopes": ["manage"]},
                       headers=_admin("192.0.2.200")).json()["secret"]
        here = "203.0.113.50"

        def me(key: str) -> httpx.Response:
            return c.get("/v1/tenant/me", headers={"Authorization": f"Bearer {key}", "X-Forwarded-For": here})

        assert me(secret).status_code == 200  # known pair from now on
        for i in range(4):  # four made-up keys: one account each, one address
            assert me(f"nmb_fake{i:04d}_{'x' * 43}").status_code == 401
        locked = me("nmb_fake9999_" + "y" * 43)
        assert locked.status_code == 429 and "network address" in locked.json()["detail"]
        assert me(spare).status_code == 429  # a real key never used from here: the address lock applies
        assert me(secret).status_code == 200  # the key that signed in from here before: spared
        rows = [a for a in _audit(c, "signin.failure") if a["after"]["kind"] == "api_key"]
        assert len(rows) == 4 and all(a["after"]["account"].startswith("nmb_fake") for a in rows)
        assert all("x" * 20 not in json.dumps(a) for a in rows)  # never the secret part


@on_session_loop
async def test_without_redis_the_process_counts_itself(settings) -> None:
    """Embedded ``make run`` without redis-server: nothing listens at the Redis URL."""
    from litestar.testing import AsyncTestClient

    unreachable = "redis://127.0.0.1:1/0"
    quick = settings.model_copy(update={"redis_url": unreachable,
                                        "signin_throttle": ThrottleSettings(free_failures=1, backoff_base_s=30)})
    async with AsyncTestClient(app=create_app(quick)) as c:
        assert (await c.get("/admin/v1/tenants", headers={"Authorization": "Bearer bad"})).status_code == 401
        assert (await c.get("/admin/v1/tenants", headers={"Authorization": "Bearer bad"})).status_code == 401
        r = await c.get("/admin/v1/tenants", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert r.status_code == 429 and r.headers["Retry-After"]
    strict = quick.model_copy(update={"signin_throttle": ThrottleSettings(store="redis")})
    async with AsyncTestClient(app=create_app(strict)) as c:
        r = await c.get("/admin/v1/tenants", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert r.status_code == 503 and "throttle" in r.json()["detail"]


def test_console_key_and_admin_token_sign_ins_share_the_doors_limits(settings) -> None:
    """Keys tried at the console and admin tokens tried at the operator sign-in are throttled and
    audited like passwords; the admin token's buckets are the same at the console and the API."""
    app = create_app(_settings(settings, free_failures=1, backoff_base_s=0, lock_after=3, lock_s=300))
    with serve(app) as url, httpx.Client(base_url=url) as c:
        tenant, secret = _tenant(c)
        here = "203.0.113.70"
        wrong = secret[:12] + "_" + "z" * 43  # the right prefix, a wrong secret part
        for _ in range(3):
            assert _login(c, "/console/login", here, method="key", api_key=wrong).status_code == 401
        locked = _login(c, "/console/login", here, method="key", api_key=secret)
        assert locked.status_code == 429 and "locked for 5 minutes" in locked.text
        rows = [a for a in _audit(c, "signin.failure") if a["after"]["kind"] == "api_key"]
        assert len(rows) == 3 and {a["after"]["account"] for a in rows} == {secret[:12]}
        assert {a["tenant_id"] for a in rows} == {tenant["id"]}  # the prefix names the key's tenant
        assert "z" * 43 not in json.dumps(rows) and secret not in json.dumps(rows)
        # Admin token: two failures at the API and one at the console lock both doors.
        for _ in range(2):
            assert c.get("/admin/v1/tenants", headers=_admin(here, "guess")).status_code == 401
        third = _login(c, "/console/admin/login", here, token="guess")
        assert third.status_code == 401 and "locked for 5 minutes" in third.text
        assert _login(c, "/console/admin/login", here, token=ADMIN_TOKEN).status_code == 429
        assert c.get("/admin/v1/tenants", headers=_admin(here)).status_code == 429
        kinds = [(a["after"]["kind"], a["after"]["channel"]) for a in _audit(c, "signin.failure")
                 if a["after"]["kind"] == "admin_token"]
        assert sorted(kinds) == [("admin_token", "api"), ("admin_token", "api"), ("admin_token", "console")]
        assert [a["after"]["scope"] for a in _audit(c, "signin.locked") if a["after"]["kind"] == "admin_token"] == [
            "pair"]
        # A successful operator sign-in from elsewhere is audited.
        assert _login(c, "/console/admin/login", "198.51.100.70", token=ADMIN_TOKEN).status_code == 303
        ok = [a for a in _audit(c, "signin.success") if a["after"]["kind"] == "admin_token"]
        assert len(ok) == 1 and ok[0]["actor"] == "admin" and ok[0]["after"]["address"] == "198.51.100.70"
