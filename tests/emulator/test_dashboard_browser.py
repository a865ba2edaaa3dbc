"""The dashboard in a real browser: Debian's Chromium driven by Playwright (no browser download).

Each test opens the page on a fresh emulator (clock frozen at 15:02), uses a control the way a
person would, and checks what the page then shows and what the emulator then holds. Skipped
only where Chromium or Playwright is missing locally; under CI (CI set) that is a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from outpost_emulator import Emulator
from tests.emulator.helpers import COUNT_ALL, START_US, Ws, event, ingest_ok

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"
TIMEOUT_MS = 15_000  # a deadline for each wait on the page, not a pause


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: CI must install it to run the browser tests")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if CHROMIUM is None:
        _missing("chromium is not installed (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright Python package is not installed (pip install playwright)")
    assert CHROMIUM is not None
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser, emu: Emulator) -> Iterator[Page]:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    opened = context.new_page()
    opened.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.goto(f"{emu.url}/")
    expect(opened.locator("#live")).to_contain_text("live")
    try:
        yield opened
    finally:
        context.close()
    assert errors == [], errors


def expect_page(locator: Any) -> Any:
    from playwright.sync_api import expect

    return expect(locator)


def test_granting_credits_shows_polars_new_balance(
    emu: Emulator, http: httpx.Client, page: Page
) -> None:
    meter = emu.create_meter("API calls", COUNT_ALL, {"func": "count"})
    ingest_ok(http, event(ext="alice"), event(ext="alice"), event(ext="alice"))
    row = page.locator("#customer-rows tr", has_text="API calls").filter(has_text="alice")
    expect_page(row.locator("td").nth(5)).to_have_text("-3")

    emu.create_meter("other", COUNT_ALL, {"func": "count"})
    page.select_option("#grant-meter", label="other")
    page.select_option("#grant-kind", "customer_id")
    row.click()  # fills the form with alice and the meter of that row
    expect_page(page.locator("#grant-kind")).to_have_value("external_customer_id")
    expect_page(page.locator("#grant-customer")).to_have_value("alice")
    expect_page(page.locator("#grant-meter")).to_have_value(meter["id"])
    page.fill("#grant-units", "10")
    with page.expect_request(lambda r: r.url.endswith("/__emulator/credits")) as sent:
        page.click("[data-testid=grant]")
    request = sent.value
    assert request.method == "POST"
    # What the admin API's loopback rule looks at: JSON, from the page's own loopback origin.
    headers = request.all_headers()
    assert headers["content-type"] == "application/json"
    assert headers["origin"] == emu.url
    assert headers["host"] == f"127.0.0.1:{emu.port}"
    assert request.post_data_json == {
        "meter_id": meter["id"],
        "units": 10,
        "external_customer_id": "alice",
    }
    expect_page(row.locator("td").nth(4)).to_have_text("10")
    expect_page(row.locator("td").nth(5)).to_have_text("7")
    expect_page(page.locator("#message")).to_have_text("granted 10 units: 10 credited now")
    assert emu.customer_meter(meter["id"], external_customer_id="alice")["balance"] == 7


def test_a_refused_grant_shows_the_emulators_answer(emu: Emulator, page: Page) -> None:
    emu.create_meter("API calls", COUNT_ALL, {"func": "count"})
    expect_page(page.locator("#grant-meter option")).to_have_text("API calls")
    page.select_option("#grant-kind", "customer_id")
    page.fill("#grant-customer", "nobody")
    page.click("[data-testid=grant]")
    expect_page(page.locator("#message")).to_have_text("credits: 404: no customer 'nobody'")
    expect_page(page.locator("#message")).to_have_class("message error")
    assert emu.state()["credits"] == []


def test_advancing_the_clock_syncs_then_seals_a_bucket(
    emu: Emulator, http: httpx.Client, page: Page
) -> None:
    emu.create_meter("API calls", COUNT_ALL, {"func": "count"})
    ingest_ok(http, event(ext="alice"), event(ext="bob"))
    bucket = page.locator("#bucket-rows tr", has_text="15:00–15:05")
    expect_page(bucket.locator(".pill")).to_have_text("open")
    expect_page(bucket.locator("td").nth(3)).to_have_text("2")  # both still in Redis

    page.click("button[data-advance='300']")  # 15:07, past the 15:05:10 close-sync
    expect_page(page.locator("#clock-now")).to_contain_text("15:07:00")
    expect_page(bucket.locator(".pill")).to_have_text("synced")
    expect_page(bucket.locator("td").nth(3)).to_have_text("0")
    expect_page(bucket.locator("td").nth(6)).to_have_text("seals at 15:16:00")
    assert emu.clock.now_us() == START_US + 300_000_000

    page.fill("#advance-seconds", "540")
    page.click("[data-testid=advance]")  # 15:16
    expect_page(bucket.locator(".pill")).to_have_text("sealed")
    assert emu.clock.now_us() == START_US + 840_000_000


def test_injecting_a_fault_lists_it_and_clearing_removes_it(emu: Emulator, page: Page) -> None:
    faults = page.locator("#fault-list li")
    expect_page(faults).to_have_text(["none"])

    page.select_option("#fault-kind", "ingest_error")
    page.fill("#fault-param", "503")
    page.fill("#fault-count", "2")
    page.click("[data-testid=inject]")
    expect_page(faults).to_have_text(["ingest answers 503: 2 more times"])
    assert emu.state()["faults"]["ingest"] == [
        {"kind": "error", "remaining": 2, "status": 503, "retry_after": None}
    ]

    page.select_option("#fault-kind", "syncs")
    expect_page(page.locator("#fault-param-label")).to_be_hidden()
    page.click("[data-testid=inject]")
    expect_page(faults).to_have_text(["ingest answers 503: 2 more times", "syncs paused"])
    assert emu.state()["faults"]["syncs_paused"] is True

    page.click("[data-testid=clear-faults]")
    expect_page(faults).to_have_text(["none"])
    state = emu.state()["faults"]
    assert state["ingest"] == [] and state["syncs_paused"] is False


def test_connected_instances_are_listed(emu: Emulator, page: Page) -> None:
    rows = page.locator("#connection-rows tr")
    expect_page(rows).to_have_text(["no Outpost instance connected"])
    with Ws(emu) as ws:
        ws.snapshot(external_customer_id="alice")
        expect_page(rows.locator("td").nth(3)).to_have_text("alice")
    expect_page(rows).to_have_text(["no Outpost instance connected"])


def test_hostile_ids_and_names_show_as_text(emu: Emulator, http: httpx.Client, page: Page) -> None:
    meter = emu.create_meter(HOSTILE, COUNT_ALL, {"func": "count"})
    emu.grant_credits(meter["id"], 5, external_customer_id=HOSTILE)
    ingest_ok(http, event(ext=HOSTILE))
    with Ws(emu) as ws:
        ws.snapshot(external_customer_id=HOSTILE)
        row = page.locator("#customer-rows tr").first
        expect_page(row.locator("td").nth(1)).to_have_text(HOSTILE)
        expect_page(row.locator("td").nth(2)).to_have_text(HOSTILE)  # the meter's name
        expect_page(page.locator("#meter-rows td").first).to_have_text(HOSTILE)
        expect_page(page.locator("#connection-rows td").nth(3)).to_have_text(HOSTILE)
        expect_page(page.locator("#grant-meter option")).to_have_text(HOSTILE)
    # Shown as text, parsed as nothing: no element was made from it and nothing ran.
    assert page.locator("main img").count() == 0
    assert page.title() == "Outpost emulator"


def test_a_very_long_id_is_cut_with_the_whole_in_its_tooltip(
    emu: Emulator, http: httpx.Client, page: Page
) -> None:
    emu.create_meter("API calls", COUNT_ALL, {"func": "count"})
    long_id = "x" * 500
    ingest_ok(http, event(ext=long_id))
    cell = page.locator("#customer-rows tr").first.locator("td").nth(1)
    expect_page(cell).to_have_text("x" * 120 + "…")
    expect_page(cell).to_have_attribute("title", long_id)
