"""Sign-in throttling as a person meets it, in a real chromium: repeated wrong passwords (and
admin tokens) end in a lock message on the sign-in page, and even the right secret is refused
until the lock ends, while another account signs in normally."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.async_api import Browser, Page, expect

from controlplane.api.app import create_app
from controlplane.config import Settings
from tests.console.conftest import PASSWORD
from tests.console.test_browser import LAPTOP, browser, shot  # noqa: F401  (the browser fixture)
from tests.controlplane.conftest import ADMIN_TOKEN, isolated_throttle
from tests.live_server import serve

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture
def cp_url(settings: Settings) -> Iterator[str]:
    # Quick to lock (third failure, ten minutes) so the test need not wait out any backoff.
    quick = isolated_throttle(free_failures=1, backoff_base_s=0, lock_after=3, lock_s=600)
    with serve(create_app(settings.model_copy(update={"signin_throttle": quick}))) as url:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        with httpx.Client(base_url=url, headers=admin) as c:
            for name, email in (("locked-out", "locked@example.com"), ("bystander", "fine@example.com")):
                assert c.post("/admin/v1/tenants", json={"name": name, "email": email,
                                                         "password": PASSWORD}).status_code == 201
        yield url


async def _password(page: Page, url: str, email: str, password: str) -> None:
    await page.goto(url + "/console/login")
    await page.get_by_label("Email", exact=True).fill(email)
    await page.get_by_label("Password", exact=True).fill(password)
    await page.get_by_role("button", name="Sign in", exact=True).click()


async def test_repeated_wrong_passwords_show_the_lock_message(cp_url: str, browser: Browser) -> None:  # noqa: F811
    page = await (await browser.new_context(**LAPTOP)).new_page()
    error = page.locator("#login-error")
    await _password(page, cp_url, "locked@example.com", "wrong password 1")
    await expect(error).to_have_text("Those credentials did not work. Keys need the 'manage' scope.")
    await _password(page, cp_url, "locked@example.com", "wrong password 2")
    await expect(error).not_to_contain_text("locked")
    await _password(page, cp_url, "locked@example.com", "wrong password 3")
    await expect(error).to_contain_text("sign-in is locked for 10 minutes")
    # Now even the right password is refused, with the same clear message and no session.
    responses = []
    page.on("response", lambda r: responses.append(r) if r.request.method == "POST" else None)
    await _password(page, cp_url, "locked@example.com", PASSWORD)
    await expect(error).to_contain_text("Too many failed sign-in attempts: sign-in is locked for 10 minutes.")
    await expect(error).to_have_attribute("data-throttled", "true")
    await expect(page.get_by_role("heading", name="Sign in to Nimbus")).to_be_visible()
    assert responses and responses[-1].status == 429 and int(responses[-1].headers["retry-after"]) > 500
    await shot(page, "laptop-login-locked")
    # Another account from the same browser is not locked out.
    await _password(page, cp_url, "fine@example.com", PASSWORD)
    await expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()


async def test_operator_sign_in_locks_too(cp_url: str, browser: Browser) -> None:  # noqa: F811
    page = await (await browser.new_context(**LAPTOP)).new_page()
    for i in range(3):
        await page.goto(cp_url + "/console/admin/login")
        await page.get_by_label("Admin token").fill(f"guess-{i}")
        await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#login-error")).to_contain_text("locked for 10 minutes")
    await page.goto(cp_url + "/console/admin/login")
    await page.get_by_label("Admin token").fill(ADMIN_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#login-error")).to_contain_text("Too many failed sign-in attempts")
    await expect(page.get_by_role("heading", name="Operator sign-in")).to_be_visible()
