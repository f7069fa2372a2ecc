"""A guided lesson in a real browser (Debian's chromium, playwright, `streamlit run`): lesson 1's
first two steps are predicted, run on the real model and revealed, and the text after each
reveal is the one written from that run (its step count; its device and dtype)."""

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking"]


def test_lesson_one_predict_run_and_reveal_in_a_real_browser(app_url):
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("Debian chromium is missing: .ci/run installs it")
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(app_url)
        page.locator('[data-testid="stSidebarNav"]').get_by_text("Guided lessons", exact=True).click(timeout=120_000)
        expect(page.locator("h1").first).to_contain_text("Guided lessons", timeout=60_000)
        expect(page.get_by_text("1. One forward pass, or several?").first).to_be_visible(timeout=60_000)

        page.get_by_text("A few steps (2 to 9)", exact=True).click()  # predict: the budget (24) is below the prompt
        page.get_by_role("button", name="Run this step on the model").click()
        expect(page.get_by_text("Ran in").first).to_be_visible(timeout=180_000)
        page.get_by_role("button", name="Reveal the measured answer").click()
        expect(page.get_by_text("Right: the measurement falls in").first).to_be_visible(timeout=60_000)
        expect(page.get_by_text("prompt tokens: each step takes up to 24 of them").first).to_be_visible()

        page.get_by_role("button", name="Next ▶").first.click()
        expect(page.get_by_text("2. Where the time to first token goes").first).to_be_visible(timeout=60_000)
        page.get_by_role("button", name="Run this step on the model").click()
        expect(page.get_by_text("Ran in").first).to_be_visible(timeout=180_000)
        page.get_by_role("button", name="Lock in my prediction: 50%").click()
        page.get_by_role("button", name="Reveal the measured answer").click()
        expect(page.get_by_text("the forward pass was").first).to_be_visible(timeout=60_000)
        assert page.get_by_text("On cpu (").count() >= 1  # the reveal names the run's device
        assert not page.locator('[data-testid="stException"]').count()
        browser.close()
