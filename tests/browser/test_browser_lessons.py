"""A guided lesson in a real browser (Debian's chromium, playwright, `streamlit run`): lesson 1's
first two steps are predicted, run on the real model and revealed, and the text after each
reveal is the one written from that run (its step count; its device and dtype)."""

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking"]


def need_chromium() -> None:
    """Skip the test where Debian's chromium is missing; on CI, which installs it, fail instead."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("Debian chromium is missing: .ci/run installs it")
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")


def open_from_sidebar(playwright, app_url: str, link: str):
    """Chromium on the app, moved to the page ``link`` through the sidebar: (browser, page) once its title shows."""
    from playwright.sync_api import expect

    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    page.locator('[data-testid="stSidebarNav"]').get_by_text(link, exact=True).click(timeout=120_000)
    expect(page.locator("h1").first).to_contain_text(link, timeout=60_000)
    return browser, page


def run_and_reveal(page, step: str, prediction: str, revealed: str) -> None:
    """On the lesson step titled ``step``: run it on the model, lock in ``prediction``, reveal, and wait for the
    text ``revealed`` of the answer."""
    from playwright.sync_api import expect

    expect(page.get_by_text(step).first).to_be_visible(timeout=60_000)
    page.get_by_role("button", name="Run this step on the model").click()
    expect(page.get_by_text("Ran in").first).to_be_visible(timeout=180_000)
    page.get_by_role("button", name=f"Lock in my prediction: {prediction}").click()
    page.get_by_role("button", name="Reveal the measured answer").click()
    expect(page.get_by_text(revealed).first).to_be_visible(timeout=60_000)


def test_lesson_one_predict_run_and_reveal_in_a_real_browser(app_url):
    need_chromium()
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser, page = open_from_sidebar(playwright, app_url, "Guided lessons")
        expect(page.get_by_text("1. One forward pass, or several?").first).to_be_visible(timeout=60_000)

        page.get_by_text("A few steps (2 to 9)", exact=True).click()  # predict: the budget (24) is below the prompt
        page.get_by_role("button", name="Run this step on the model").click()
        expect(page.get_by_text("Ran in").first).to_be_visible(timeout=180_000)
        page.get_by_role("button", name="Reveal the measured answer").click()
        expect(page.get_by_text("Right: the measurement falls in").first).to_be_visible(timeout=60_000)
        expect(page.get_by_text("prompt tokens: each step takes up to 24 of them").first).to_be_visible()

        page.get_by_role("button", name="Next ▶").first.click()
        run_and_reveal(page, "2. Where the time to first token goes", prediction="50%", revealed="the forward pass was")
        assert page.get_by_text("On cpu (").count() >= 1  # the reveal names the run's device
        assert not page.locator('[data-testid="stException"]').count()
        browser.close()


def test_the_papers_page_and_lesson_six_in_a_real_browser(app_url):
    """The Reproduce the papers page runs its first experiment (the decode piggyback, on the real model)
    and draws it beside Sarathi-Serve's Table 2; lesson 6's first step runs and reveals. Screenshots of
    both go to out/screenshots/ (git-ignored)."""
    need_chromium()
    from playwright.sync_api import expect, sync_playwright

    screenshots = Path(__file__).resolve().parents[2] / "out" / "screenshots"
    screenshots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser, page = open_from_sidebar(playwright, app_url, "Reproduce the papers")
        chunk = page.locator('[data-testid="stSlider"]').filter(has_text="Chunk C").get_by_role("slider")
        chunk.press("Home")  # C = 64, the smallest: a short run
        expect(page.locator('[data-testid="stSlider"]').filter(has_text="Chunk C")).to_contain_text(
            "64", timeout=30_000)
        page.get_by_role("button", name="Time the three steps").click()
        expect(page.get_by_text("Decode token riding along").first).to_be_visible(timeout=180_000)
        # the paper's bars, in the chart's legend
        expect(page.get_by_text("Sarathi-Serve, Table 2").first).to_be_visible(timeout=60_000)
        assert not page.locator('[data-testid="stException"]').count()
        page.screenshot(path=str(screenshots / "papers_page.png"))
        # Streamlit scrolls its main area, not the page
        page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
        page.screenshot(path=str(screenshots / "papers_page_figure.png"))

        page.locator('[data-testid="stSidebarNav"]').get_by_text("Guided lessons", exact=True).click()
        expect(page.locator("h1").first).to_contain_text("Guided lessons", timeout=60_000)
        page.get_by_text("6. Reproduce the papers", exact=False).first.click()
        run_and_reveal(page, "1. Decodes ride along a prefill almost for free", prediction="5×",
                       revealed="The paper measured")
        assert not page.locator('[data-testid="stException"]').count()
        page.screenshot(path=str(screenshots / "papers_lesson_6.png"))
        page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
        page.screenshot(path=str(screenshots / "papers_lesson_6_figure.png"))
        browser.close()
