"""One real-browser run: Debian's chromium driven by playwright against `streamlit run`.

Starts the app on 127.0.0.1, opens a shared link to a page first (the app's navigation, not
Streamlit's pages-folder one), runs a prefill twice (the first press of a fresh app must show a
TTFT within 1.5x of the second's: no user sees a cold run), waits for the plotly charts to
render, visits every page and saves a screenshot of each to out/screenshots/ (git-ignored).
For four pages it also saves the view of a chart to out/screenshots/readme/: the README's
pictures (assets/screenshots/ holds the copies committed). On the Kernel timings page it first
runs the prompt on both backends (what tuning buys).
"""

import json
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "out" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PAGES = [
    ("Prefill", "Prefill"),
    ("Parallel vs token-by-token", "Parallel"),
    ("KV cache", "KV cache"),
    ("Watch it happen", "Watch it happen"),
    ("Attention", "Attention"),
    ("Kernel timings", "Kernel"),
    ("Long prompts", "Long prompts"),
    ("Chunked prefill", "Chunked prefill"),
    ("Disaggregated prefill", "Disaggregated"),
    ("Prefix cache", "Prefix cache"),
    ("Your server", "Your server"),
    ("Live engine", "Live engine"),
    ("Reproduce the papers", "Reproduce the papers"),
    ("Guided lessons", "Guided lessons"),
]
README_SHOTS = {  # page title -> (file name, what the picture starts at)
    "Prefill": ("prefill", '[data-testid="stMetric"]'),  # the TTFT and its breakdown
    "KV cache": ("kv_cache", ".js-plotly-plot"),
    "Attention": ("attention", ".js-plotly-plot"),
    "Kernel": ("what_tuning_buys", ".st-key-kernels_backends_chart"),  # the textbook and the measured backend
}
SCROLL_TO_TOP = """element => {
    element.scrollIntoView({block: "start"});
    let box = element.parentElement;  // the scrolling main area: leave room under Streamlit's header
    while (box && !(box.scrollHeight > box.clientHeight && \
getComputedStyle(box).overflowY !== "visible")) box = box.parentElement;
    if (box) box.scrollTop -= 90;
}"""
ALL_CHARTS_DRAWN = ("() => [...document.querySelectorAll('.js-plotly-plot')]"
                    ".every(chart => chart.querySelector('.main-svg'))")
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]


def ttft_ms(page) -> float:
    metric = page.locator('[data-testid="stMetric"]').filter(has_text="Time to first token")
    value = metric.locator('[data-testid="stMetricValue"]')
    return float(value.inner_text().removesuffix(" ms").replace(",", ""))


def ttft_caption(page) -> str:
    return page.get_by_text("TTFT: median of").first.inner_text().strip()


def settled(page) -> None:
    """Wait until the page's script run has ended and every plotly chart on it has drawn."""
    from playwright.sync_api import expect

    expect(page.locator('[data-testid="stStatusWidgetRunningIcon"]')).to_have_count(0, timeout=60_000)
    page.wait_for_function(ALL_CHARTS_DRAWN, timeout=30_000)
    page.wait_for_timeout(300)


def readme_shot(page, title: str) -> None:
    """The page scrolled to what the README shows of it."""
    if title in README_SHOTS:
        name, start = README_SHOTS[title]
        page.locator(start).first.evaluate(SCROLL_TO_TOP)
        page.wait_for_timeout(500)
        page.screenshot(path=str(SCREENSHOTS / "readme" / f"{name}.png"))


def test_prefill_then_every_page_in_a_real_browser(app_url):
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("Debian chromium is missing: .ci/run installs it")
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import expect, sync_playwright

    (SCREENSHOTS / "readme").mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        # a fresh server's first visit is a shared link to a page: it opens that page with the app's own
        # navigation (page titles), not Streamlit's pages-folder one (file names, and an "app" entry)
        page.goto(f"{app_url}/kv_cache")
        expect(page.locator("h1").first).to_contain_text("KV cache", timeout=120_000)
        # never blank: the page drew itself while the fresh server was still preparing the model, and says how far
        expect(page.locator('[data-testid="stProgress"]').first).to_contain_text("Preparing bundled:SmolLM2-135M")
        navigation = page.locator('[data-testid="stSidebarNav"]')
        expect(navigation.get_by_text("Parallel vs token-by-token", exact=True)).to_be_visible(timeout=30_000)
        assert navigation.get_by_text("app", exact=True).count() == 0
        page.goto(app_url)
        expect(page.get_by_role("button", name="Run prefill")).to_be_visible(timeout=120_000)
        # as a person would, and as before the second press: the page finishes drawing first. Pressed
        # while chromium still drew it, the first press's timing passes shared the 2 cores with it (one
        # CI run: other processes 26%, passes 18.1-40.0 ms, median 28.4 against the second's 18.6)
        page.wait_for_timeout(2000)
        page.get_by_role("button", name="Run prefill").click(timeout=120_000)
        page.wait_for_selector(".js-plotly-plot .main-svg", timeout=180_000)
        expect(page.locator(".js-plotly-plot")).to_have_count(3, timeout=60_000)
        expect(page.get_by_text("Time to first token").first).to_be_visible()
        first_ttft_ms, first_caption = ttft_ms(page), ttft_caption(page)
        page.wait_for_timeout(2000)  # as a person would: the charts finish drawing before the next press
        page.get_by_role("button", name="Run prefill").click()
        # the second press's result
        expect(page.get_by_text(first_caption, exact=True)).to_have_count(0, timeout=120_000)
        expect(page.get_by_text("TTFT: median of").first).to_be_visible(timeout=120_000)
        second_ttft_ms = ttft_ms(page)
        (SCREENSHOTS.parent / "two_presses_ttft.json").write_text(json.dumps(
            {"first_ms": first_ttft_ms, "second_ms": second_ttft_ms, "captions": [first_caption, ttft_caption(page)]}))
        # the app warmed the model up through the engine, and a headline is a median of timing passes:
        # the first press of a fresh app is no colder than the second. (Only that direction is
        # asserted: a second press that is slower because the browser is busy on 2 cores is noise,
        # not a cold run; both figures are in out/two_presses_ttft.json.)
        assert first_ttft_ms < 1.5 * second_ttft_ms, (first_ttft_ms, second_ttft_ms)
        page.screenshot(path=str(SCREENSHOTS / "1_prefill.png"), full_page=True)
        readme_shot(page, "Prefill")
        for index, (link, title) in enumerate(PAGES[1:], start=2):
            page.locator('[data-testid="stSidebarNav"]').get_by_text(link, exact=True).click()
            expect(page.locator("h1").first).to_contain_text(title, timeout=60_000)
            settled(page)  # charts restored from the session drawn
            if title == "Kernel":  # what tuning buys: the page's prompt on both backends
                page.get_by_role("button", name="Compare the two backends").click()
                page.wait_for_selector(".st-key-kernels_backends_chart .main-svg", timeout=180_000)
                settled(page)
            assert not page.locator('[data-testid="stException"]').count(), f"{link} shows an exception"
            page.screenshot(path=str(SCREENSHOTS / f"{index}_{title.lower().replace(' ', '_')}.png"), full_page=True)
            readme_shot(page, title)
        browser.close()
    assert len(list(SCREENSHOTS.glob("*.png"))) >= len(PAGES)
    assert (sorted(p.stem for p in (SCREENSHOTS / "readme").glob("*.png"))
            == sorted(name for name, _ in README_SHOTS.values()))
