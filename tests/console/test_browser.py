"""The console in a real chromium (Debian's, driven by Playwright) against the real stack:
control plane on Postgres under uvicorn, the edge proxy, and a simulator replica.

Screenshots of every page land in tests/_artifacts/console/ (laptop and phone viewports)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from controlplane.models import ApiKey
from tests.conftest import truncate_all
from tests.console.conftest import PASSWORD
from tests.console.fleet_rows import EXPECTED
from tests.console.stack import Stack, running_stack
from tests.controlplane.conftest import ADMIN_TOKEN

# Fixtures run on the session loop (pyproject), so the tests must share it with the browser they use.
pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

CHROMIUM = os.environ.get("NIMBUS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "_artifacts" / "console"
LAPTOP = {"viewport": {"width": 1366, "height": 850}}
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True, "has_touch": True}
SECRET = re.compile(r"nmb_[a-z0-9]{8}_[A-Za-z0-9_-]{20,}")


@pytest.fixture(scope="module")
def stack(pg_database: str, tmp_path_factory) -> Iterator[Stack]:
    with running_stack(pg_database, tmp_path_factory.mktemp("console-stack")) as s:
        yield s
    truncate_all(pg_database)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not os.path.exists(CHROMIUM):  # noqa: ASYNC240  (one stat before any await)
        pytest.fail(f"chromium not found at {CHROMIUM}: install Debian's package (apt-get install -y chromium); "
                    "CI's .ci/run does this. Never `playwright install`.")
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            await b.close()


async def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


async def sign_in(page: Page, stack: Stack) -> None:
    await page.goto(stack.cp_url + "/console/login")
    await page.get_by_label("Email", exact=True).fill(stack.data["alice"]["email"])
    await page.get_by_label("Password", exact=True).fill(PASSWORD)
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()


async def unlabeled_controls(page: Page) -> list[str]:
    return await page.evaluate("""() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
        .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).map(e => e.outerHTML)""")


async def test_tenant_journey(stack: Stack, browser: Browser) -> None:
    context = await browser.new_context(**LAPTOP)
    page = await context.new_page()
    await sign_in(page, stack)
    await shot(page, "laptop-dashboard-empty")

    # --- keys: create, see the secret once, revoke
    await page.get_by_role("link", name="API keys").click()
    await page.get_by_label("Name").fill("ci-deploy")
    await page.get_by_role("button", name="Create key").click()
    secret = await page.get_by_label("Secret").input_value()
    assert SECRET.fullmatch(secret), secret
    await expect(page.get_by_text("shown this once")).to_be_visible()
    await shot(page, "laptop-keys-created")
    prefix = secret[:12]
    await page.goto(stack.cp_url + "/console/keys")
    html = await page.content()
    assert secret not in html and not SECRET.search(html), "a secret is still in the page after its first display"
    row = page.locator(f'tr[data-prefix="{prefix}"]')
    await expect(row.locator(".status")).to_have_text("active")
    page.once("dialog", lambda d: d.accept())
    await row.get_by_role("button", name=f"Revoke key {prefix}").click()
    await expect(page.get_by_role("status")).to_contain_text(f"Key {prefix} was revoked")
    await expect(page.locator(f'tr[data-prefix="{prefix}"] .status')).to_have_text("revoked")
    await shot(page, "laptop-keys-revoked")
    # a key limited to one model: the edge treats every other model as absent for it
    limited_to = stack.data["batch_model"]["name"]
    await page.get_by_label("Name").fill("batch-only")
    await page.locator("form[aria-labelledby=create-h]").get_by_label(limited_to, exact=True).check()
    await page.get_by_role("button", name="Create key").click()
    limited = (await page.get_by_label("Secret").input_value())[:12]
    await expect(page.locator(f'tr[data-prefix="{limited}"] .models')).to_have_text(limited_to)
    await expect(page.locator(f'tr[data-prefix="{prefix}"] .models')).to_have_text("all")
    # ...and its models can be changed afterwards, from its own row
    row = page.locator(f'tr[data-prefix="{limited}"]')
    await row.get_by_text("Change").click()
    await row.get_by_label(limited_to, exact=True).uncheck()
    await row.get_by_role("button", name=f"Save the models of key {limited}").click()
    await expect(page.get_by_role("status")).to_contain_text(f"Key {limited} now has the models")
    await expect(page.locator(f'tr[data-prefix="{limited}"] .models')).to_have_text("all")
    await page.goto(stack.cp_url + "/console/keys")  # the steps below start from a fresh keys page

    # --- playground: tokens stream in through the edge
    await page.get_by_role("link", name="Playground").click()
    await page.get_by_label("Message").fill("Tell me about inference clouds.")
    await page.get_by_label("Max tokens").fill("48")
    await page.evaluate("""() => {
        window.__lengths = [];
        const out = document.getElementById('pg-output');
        new MutationObserver(() => window.__lengths.push(out.textContent.length))
            .observe(out, {childList: true, characterData: true, subtree: true});
    }""")
    await page.get_by_role("button", name="Send").click()
    await expect(page.locator("#pg-status")).to_contain_text("48 completion tokens", timeout=30_000)
    lengths = await page.evaluate("window.__lengths")
    growing = sorted(set(n for n in lengths if n > 0))
    assert len(growing) >= 5, f"the answer arrived in too few steps to be streamed: {lengths}"
    assert (await page.locator("#pg-output").text_content()).strip()
    await shot(page, "laptop-playground")

    # --- usage reaches the dashboard chart (edge -> usage stream -> minute buckets)
    assert stack.ingest_usage(min_events=1) >= 1
    await page.goto(stack.cp_url + "/console/dashboard?range=1h")
    requests_chart = page.locator("#chart-requests")
    assert int(await requests_chart.get_attribute("data-points")) >= 1
    assert await requests_chart.locator("rect.bar").count() >= 1
    assert await page.locator("#chart-ttft circle.dot").count() >= 1
    assert int((await page.locator("#stat-requests").text_content()).replace(",", "")) >= 1
    await shot(page, "laptop-dashboard-with-usage")

    for path, name in (("/console/models", "models"), ("/console/latency?range=1h", "latency"),
                       ("/console/usage?range=1h&granularity=minute", "usage")):
        await page.goto(stack.cp_url + path)
        assert await unlabeled_controls(page) == [], path
        await shot(page, f"laptop-{name}")
    await expect(page.locator("#usage tbody tr").first).to_contain_text(stack.data["model"]["name"])
    async with page.expect_download() as download_info:
        await page.get_by_role("link", name="Download CSV").click()
    csv_path = await (await download_info.value).path()
    csv_text = await asyncio.to_thread(Path(csv_path).read_text)
    assert csv_text.startswith("bucket_start,model,tier,requests") and stack.data["model"]["name"] in csv_text
    await page.goto(stack.cp_url + f"/console/models/{stack.data['model']['name']}")
    await expect(page.locator("table.breakdown")).to_contain_text("41.5 s")  # cold start from the replica
    await shot(page, "laptop-model-detail")

    # --- tenant A cannot open tenant B's pages
    private = stack.data["private_model"]["name"]
    response = await page.goto(stack.cp_url + f"/console/models/{private}")
    assert response.status == 404
    await shot(page, "laptop-other-tenant-404")
    await page.goto(stack.cp_url + "/console/keys")
    assert stack.data["bob_secret"][:12] not in await page.content()

    # --- sign out: the session's playground key is revoked with it
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_role("heading", name="Sign in to Nimbus")).to_be_visible()
    engine = create_engine(stack.db_url)
    with Session(engine) as s:
        session_keys = s.scalars(select(ApiKey).where(ApiKey.name == "console-session",
                                                      ApiKey.tenant_id == stack.data["alice"]["id"])).all()
    engine.dispose()
    assert session_keys and all(k.revoked_at is not None for k in session_keys)
    await context.close()


async def test_phone_layout_keyboard_and_contrast(stack: Stack, browser: Browser) -> None:
    context = await browser.new_context(**PHONE)
    page = await context.new_page()
    await page.goto(stack.cp_url + "/console/login")
    # keyboard: the first Tab lands on the skip link, which moves focus to the main content
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.className") == "skip"
    await page.keyboard.press("Enter")
    assert await page.evaluate("document.activeElement.id") == "main"
    order = []
    for _ in range(3):
        await page.keyboard.press("Tab")
        order.append(await page.evaluate("document.activeElement.id || document.activeElement.textContent.trim()"))
    assert order == ["api_key", "Sign in with key", "email"], order
    assert await unlabeled_controls(page) == []
    await shot(page, "phone-login")

    await sign_in(page, stack)
    for path, name in (("/console/dashboard?range=1h", "dashboard"), ("/console/keys", "keys"),
                       ("/console/playground", "playground"), ("/console/usage", "usage")):
        await page.goto(stack.cp_url + path)
        # a phone browser zooms out to fit overflowing content, so compare with the device width itself
        overflow = await page.evaluate("document.documentElement.scrollWidth") - PHONE["viewport"]["width"]
        assert overflow <= 0, f"{path} scrolls sideways on a phone by {overflow}px"
        assert await unlabeled_controls(page) == [], path
        await shot(page, f"phone-{name}")

    # contrast of text against its background, WCAG AA (4.5:1 for body-size text)
    ratios = await page.evaluate("""() => {
        const rgb = s => s.match(/[\\d.]+/g).slice(0, 4).map(Number);
        const lum = ([r, g, b]) => { const f = c => (c /= 255) <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
                                      return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
        const bg = el => { for (; el; el = el.parentElement) { const c = rgb(getComputedStyle(el).backgroundColor);
                             if (c.length < 4 || c[3] > 0) return c; } return [255, 255, 255]; };
        const out = {};
        for (const sel of ['body', 'h1', '.hint', '.top nav a', 'button', 'th', 'td', 'label', 'a']) {
            const el = document.querySelector(sel); if (!el) continue;
            const a = lum(rgb(getComputedStyle(el).color)), b = lum(bg(el));
            out[sel] = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
        }
        return out;
    }""")
    low = {k: round(v, 2) for k, v in ratios.items() if v < 4.5}
    assert ratios and not low, f"contrast below 4.5:1: {low}"
    await context.close()


async def test_operator_views(stack: Stack, browser: Browser) -> None:
    context = await browser.new_context(**LAPTOP)
    page = await context.new_page()
    await page.goto(stack.cp_url + "/console/admin")
    await expect(page.get_by_role("heading", name="Operator sign-in")).to_be_visible()
    await page.get_by_label("Admin token").fill(ADMIN_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#tenants")).to_contain_text("Alice Labs")
    await expect(page.locator("#tenants")).to_contain_text("600")  # Alice's requests/min quota
    await shot(page, "operator-tenants")

    await page.get_by_role("link", name="Pools", exact=True).click()
    pool_row = page.locator("#pools tr", has_text=stack.data["pool"]["name"])
    await expect(pool_row).to_contain_text("1 ready")
    await expect(pool_row).to_contain_text("25%")  # KV use reported by the replica
    await expect(page.locator("table.decisions")).to_contain_text("queue delay p90 1.8 s")
    await shot(page, "operator-pools")

    await pool_row.get_by_role("link", name=stack.data["pool"]["name"]).click()
    await expect(page.locator("#replicas")).to_contain_text("41.5 s")
    await expect(page.locator("#schedule")).to_contain_text("mon,tue,wed,thu,fri 09:00–18:00: min 2 (Europe/Berlin)")
    await expect(page.locator("table.operations")).to_contain_text("InsufficientInstanceCapacity")
    await shot(page, "operator-pool-detail")

    await page.get_by_role("link", name="Nodes").click()
    await expect(page.locator("#nodes")).to_contain_text("us-east-1a")
    await shot(page, "operator-nodes")
    await page.get_by_role("link", name="Operations").click()
    await expect(page.locator("table.operations")).to_contain_text("blocked zone")
    await shot(page, "operator-operations")
    assert ADMIN_TOKEN not in await page.content()
    cookies = await context.cookies()
    assert all(ADMIN_TOKEN not in c["value"] for c in cookies)
    assert {c["name"]: (c["httpOnly"], c["secure"], c["sameSite"]) for c in cookies}["nimbus_operator"] == (
        True, True, "Strict")
    await context.close()


async def sign_in_operator(page: Page, stack: Stack) -> None:
    await page.goto(stack.cp_url + "/console/admin/login")
    await page.get_by_label("Admin token").fill(ADMIN_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#tenants")).to_be_visible()


async def test_operator_fleet_and_node_slot_map(stack: Stack, browser: Browser) -> None:
    """Fleet totals, $/hour by pool, and a shared node's GPU slot map (rows from tests.console.fleet_rows)."""
    ids, main, batch = stack.data["fleet"], stack.data["pool"]["name"], stack.data["batch_pool"]["name"]
    context = await browser.new_context(**LAPTOP)
    page = await context.new_page()
    await sign_in_operator(page, stack)

    # --- fleet view: billed vs allocated GPUs, fragmentation, $/hour split by pool
    await page.get_by_role("link", name="Fleet", exact=True).click()
    await expect(page.get_by_role("heading", name="Fleet", exact=True)).to_be_visible()
    for stat in ("billed", "allocated", "free", "cost"):
        await expect(page.locator(f"#fleet-{stat}")).to_have_text(EXPECTED[stat])
    for name, key in ((main, "main"), (batch, "batch"), ("unallocated", "unallocated")):
        await expect(page.locator(f'#fleet-by-pool tr[data-pool="{name}"]')).to_contain_text(EXPECTED[key])
    groups = page.locator("#fleet-groups tbody tr")
    await expect(groups).to_have_count(3)  # g6 on-demand, g6 spot, p5 on-demand; the terminated node is gone
    p5 = page.locator("#fleet-groups tr", has_text="p5.48xlarge")
    await expect(p5.locator("td").nth(5)).to_have_text("8")
    await expect(p5.locator("td").nth(6)).to_have_text("6")
    assert ids["gone_node"][:8] not in await page.locator("#fleet-groups").text_content()
    await shot(page, "operator-fleet")

    # --- the shared node: two pools on distinct GPU cells, a draining replica, a consolidation copy, free slots
    await p5.get_by_role("link", name=ids["shared_node"][:8]).click()
    await expect(page.get_by_role("heading", name=f"Node {ids['shared_node'][:8]}")).to_be_visible()
    await expect(page.locator("#node-facts")).to_contain_text("us-east-1b")
    await expect(page.locator("#node-price")).to_contain_text("$96.00/hour")
    await expect(page.locator("#node-cached")).to_have_text("org/batch-model, org/main-model")
    slots = page.locator("#slots > li")
    await expect(slots).to_have_count(8)
    cell = {i: page.locator(f'#slots > li[data-gpu="{i}"]') for i in range(8)}
    for i in (0, 1):
        await expect(cell[i]).to_contain_text(main)
        await expect(cell[i]).to_contain_text("starting")
        await expect(cell[i]).to_contain_text(ids["main_starting"][:8])
    for i in (2, 3):
        await expect(cell[i]).to_contain_text(batch)
        await expect(cell[i]).to_contain_text(ids["batch_ready"][:8])
        assert main not in await cell[i].text_content()
    await expect(cell[4].locator(".pill").first).to_have_text("draining")  # told to stop, reported ready
    await expect(cell[5]).to_contain_text(f"consolidation copy of {ids['sim_replica'][:8]}")
    for i in (6, 7):
        await expect(cell[i]).to_have_class(re.compile(r"\bfree\b"))
        await expect(cell[i]).to_contain_text("free")
    assert await page.locator("#slots > li.free").count() == 2
    await shot(page, "operator-node-slots")

    # --- the emptied node's consolidation record, then a slot's pool link leads to the pool's replicas
    await page.goto(stack.cp_url + f"/console/admin/nodes/{ids['sim_node']}")
    await expect(page.locator("#node-consolidation")).to_contain_text("delete")
    await expect(page.locator("#node-consolidation")).to_contain_text("$0.80/hour")
    await expect(page.locator("#node-price")).to_contain_text("catalog")
    await expect(page.locator("table.operations")).to_contain_text("InsufficientInstanceCapacity")
    await page.goto(stack.cp_url + f"/console/admin/nodes/{ids['shared_node']}")
    await cell[2].get_by_role("link", name=batch).click()
    stopping = page.locator(f'#replicas tr[data-replica="{ids["batch_stopping"]}"]')
    await expect(stopping).to_contain_text("stopped")  # desired state
    await expect(stopping).to_contain_text("4")  # GPU index
    await stopping.get_by_role("link", name=ids["shared_node"][:8]).click()
    await expect(page.locator("#slots")).to_be_visible()
    await context.close()

    # --- the new pages fit a phone
    context = await browser.new_context(**PHONE)
    page = await context.new_page()
    await sign_in_operator(page, stack)
    for path in ("/console/admin/fleet", f"/console/admin/nodes/{ids['shared_node']}"):
        await page.goto(stack.cp_url + path)
        overflow = await page.evaluate("document.documentElement.scrollWidth") - PHONE["viewport"]["width"]
        assert overflow <= 0, f"{path} scrolls sideways on a phone by {overflow}px"
    await shot(page, "phone-operator-node-slots")
    await context.close()


async def test_caching_settings_and_clear_my_cache(stack: Stack, browser: Browser) -> None:
    """The caching page: the semantic cache per model with a threshold inside the operator's bounds
    (outside them: the page says why), and "Clear my cache", which deletes this tenant's entries."""
    import redis as redis_sync

    from tests.console.stack import SHARED_REDIS

    context = await browser.new_context(**LAPTOP)
    page = await context.new_page()
    await sign_in(page, stack)
    await page.get_by_role("link", name="Caching").click()
    await expect(page.get_by_role("heading", name="Response caching")).to_be_visible()
    assert await unlabeled_controls(page) == []
    model = stack.data["batch_model"]["name"]
    form = page.locator("#cache-settings")
    await form.get_by_label(model, exact=True).check()
    threshold = form.get_by_label(re.compile("Similarity threshold"))
    await threshold.fill("0.5")  # below the operator's bound: the browser refuses it before sending
    assert not await threshold.evaluate("e => e.validity.valid")  # (the API refuses it too: test_cache_settings)
    await form.get_by_label(re.compile("Similarity threshold")).fill("0.9")
    await form.get_by_role("button", name="Save").click()
    await expect(page.get_by_role("status")).to_contain_text("Saved")
    await expect(form.get_by_label(model, exact=True)).to_be_checked()
    await expect(form.get_by_label(re.compile("Similarity threshold"))).to_have_value("0.9")
    await shot(page, "laptop-caching")

    # One cached answer of this tenant and one of another: the purge deletes only the first.
    r = redis_sync.Redis.from_url(SHARED_REDIS)
    mine = f"nimbus:rcache:console-test:{stack.data['alice']['id']}:k"
    theirs = "nimbus:rcache:console-test:00000000-0000-0000-0000-000000000000:k"
    try:
        r.set(mine, b"{}", px=60_000)
        r.set(theirs, b"{}", px=60_000)
        await page.get_by_role("button", name="Clear my cache").click()
        await expect(page.locator("#purged")).to_contain_text("1 cached answers deleted")
        assert not r.exists(mine) and r.exists(theirs)
    finally:
        r.delete(mine, theirs)
    await context.close()
