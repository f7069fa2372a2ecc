"""The replay file in a real browser (Debian's chromium, playwright), offline: recorded on the bundled
model, written as one HTML file, opened from disk with the network blocked. It plays, scrubs, steps,
points at a token, an attention cell and a block; the frame counts are the traces' events, the highlighted
slots are the token's slot mapping, the attention map's lit row and column are the pointed token's,
nothing asks the network for anything and no page error is logged. A screenshot of each scene goes to
out/screenshots/ (git-ignored)."""

import json
from pathlib import Path

from prefillviz.experiments.chunked import LONG_REQUEST_ID
from prefillviz.experiments.replay_runs import record_replay
from prefillviz.figures.replay.build import replay_payload
from prefillviz.figures.replay.frames import num_events
from prefillviz.figures.replay.page import replay_html, write_replay
from prefillviz.figures.replay.scenes import token_slots
from tests.browser.test_browser_lessons import CHROMIUM, CHROMIUM_FLAGS, need_chromium

SCREENSHOTS = Path(__file__).resolve().parents[2] / "out" / "screenshots"
NUM_TOKENS = 40


def scrub_to(page, shown: int) -> None:
    page.locator("#replay input[type=range]").fill(str(shown))


def shown(page) -> int:
    return int(page.locator("#replay").get_attribute("data-shown"))


def test_the_exported_replay_plays_offline_and_points_at_a_tokens_slots(bundled, tmp_path):
    need_chromium()
    from playwright.sync_api import expect, sync_playwright

    runs = record_replay(bundled, NUM_TOKENS)
    path = write_replay(replay_html(replay_payload(runs)), tmp_path / "replay.html")
    events = {"prefill": num_events(runs.parallel) + num_events(runs.token_by_token),
              "chunked": num_events(runs.chunked), "prefix": num_events(runs.prefix)}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
        asked = []
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                      else (asked.append(route.request.url), route.abort()))
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.goto(path.as_uri())
        root = page.locator("#replay")
        expect(root).to_have_attribute("data-ready", "true", timeout=30_000)
        assert int(root.get_attribute("data-frames")) == sum(events.values())
        for scene, count in events.items():
            assert int(page.locator(f"section[data-scene={scene}]").get_attribute("data-frames")) == count

        # play, then pause: frames appear as their measured times come
        page.get_by_role("button", name="▶ play").click()
        page.wait_for_function("Number(document.querySelector('#replay').dataset.shown) > 0", timeout=30_000)
        page.locator("#replay button[data-action=play]").click()
        expect(root).to_have_attribute("data-playing", "false")
        # scrub to the end of the one-step prefill (1 step + 30 layers + 1 token), in step order
        page.select_option("#replay select[aria-label='time axis']", "step")
        scrub_to(page, 2 * 32)
        assert shown(page) == 64
        page.get_by_role("button", name="step ▶").click()
        assert shown(page) == 65
        page.get_by_role("button", name="◀ step").click()
        assert shown(page) == 64
        page.keyboard.press("ArrowRight")  # a presenter's clicker
        assert shown(page) == 65
        page.keyboard.press("PageUp")
        assert shown(page) == 64
        assert "step 1 of 1" in page.locator("section[data-scene=prefill] .lane[data-lane='0'] .clock").inner_text()

        # point at a token: its slot in every layer, in both runs, is its slot mapping
        position = 21
        page.locator(f"section[data-scene=prefill] .tokens span[data-pos='{position}']").hover()
        for lane, trace in enumerate((runs.parallel, runs.token_by_token)):
            request_id = next(iter(trace.requests))
            lit = page.locator(f"section[data-scene=prefill] .lane[data-lane='{lane}']")
            expected = [list(pair) for pair in token_slots(trace, request_id, position)]
            assert len(expected) == 30
            assert json.loads(lit.get_attribute("data-highlight-slots")) == expected
            assert lit.get_attribute("data-highlight-block") == str(expected[0][1] // 16)
        # ... and its row (its query) and column (its key) in the prefill step's attention map
        attention = page.locator("section[data-scene=prefill] .attention")
        assert attention.get_attribute("data-shown") == "true"  # every layer of the one step has run
        assert (attention.get_attribute("data-highlight-row"), attention.get_attribute("data-highlight-col")) == (
            str(position), str(position))
        page.screenshot(path=str(SCREENSHOTS / "replay_prefill.png"), full_page=True)
        # point at a map cell (query 30, key 5): both tokens light up; then the last layer's map
        canvas = attention.locator("canvas")
        box = canvas.bounding_box()
        cell = box["width"] / NUM_TOKENS  # square: one cell a (query, key)
        canvas.hover(position={"x": (5 + 0.5) * cell, "y": (30 + 0.5) * cell})
        assert (attention.get_attribute("data-highlight-row"), attention.get_attribute("data-highlight-col")) == (
            "30", "5")
        strip = page.locator("section[data-scene=prefill] .tokens")
        expect(strip.locator("span[data-pos='30']")).to_have_class("hl")
        expect(strip.locator("span[data-pos='5']")).to_have_class("hlkey")
        attention.locator("select[aria-label='attention layer']").select_option("29")
        assert attention.get_attribute("data-layer") == "29" and attention.get_attribute("data-shown") == "true"
        page.locator("#replay button[data-action=presenter]").click()  # larger on a projector
        assert canvas.bounding_box()["width"] > box["width"]
        page.locator("#replay button[data-action=presenter]").click()

        # chunked: point at a token of the long prompt -> the chunk that ran it
        page.locator("#replay nav button[data-scene=chunked]").click()
        scrub_to(page, events["chunked"])
        page.locator("section[data-scene=chunked] .tokens span[data-pos='30']").hover()
        step, chunk = next((s.step_index, c) for s in runs.chunked.steps for c in s.chunks if c.request_id ==
                           LONG_REQUEST_ID and c.start_position <= 30 < c.start_position + c.num_tokens)
        lane = page.locator("section[data-scene=chunked] .lane")
        assert lane.get_attribute("data-highlight-chunk") == f"{step}:{chunk.start_position}:{chunk.num_tokens}"
        page.screenshot(path=str(SCREENSHOTS / "replay_chunked.png"), full_page=True)

        # prefix: after the run, q2's first block is a hit, and it is q1's first block
        page.locator("#replay nav button[data-scene=prefix]").click()
        scrub_to(page, events["prefix"])
        q2_first = page.locator("section[data-scene=prefix] .prow[data-request=q2] .pblock").first
        expect(q2_first).to_have_class("pblock hit")
        q2_first.hover()
        q1_first = page.locator("section[data-scene=prefix] .prow[data-request=q1] .pblock").first
        expect(q1_first).to_have_class("pblock hl")
        assert q1_first.get_attribute("data-block") == q2_first.get_attribute("data-block")
        page.screenshot(path=str(SCREENSHOTS / "replay_prefix.png"), full_page=True)
        browser.close()
    assert errors == [] and asked == []


def test_the_page_records_and_embeds_the_same_player(app_url):
    """The Watch it happen page in the app: record 8 tokens, then the embedded player has its frame count,
    plays and points, with no page error; the download button offers the file."""
    need_chromium()
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1200})
        asked = []  # the network blocked: only the app's own server answers
        context.route("**/*", lambda route: route.continue_()
                      if route.request.url.startswith((app_url, "data:", "blob:", "about:"))
                      else (asked.append(route.request.url), route.abort()))
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{app_url}/watch")
        expect(page.locator("h1").first).to_contain_text("Watch it happen", timeout=120_000)
        slider = page.get_by_role("slider")
        slider.focus()
        slider.press("Home")
        for _ in range(6):  # 2 -> 8 tokens
            slider.press("ArrowRight")
        expect(slider).to_have_value("8")
        record = page.get_by_role("button", name="Record the three runs", exact=True)  # not "... model loading"
        expect(record).to_be_enabled(timeout=180_000)
        record.click()
        player = page.frame_locator("iframe").locator("#replay")
        expect(player).to_have_attribute("data-ready", "true", timeout=300_000)
        frames = int(player.get_attribute("data-frames"))
        assert frames > 32 + 8 * 31 + 1  # one step of 30 layers, then 8 steps of 30 layers, then the other scenes
        page.frame_locator("iframe").get_by_role("button", name="▶ play").click()
        expect(player).not_to_have_attribute("data-shown", "0", timeout=30_000)
        page.frame_locator("iframe").locator("section[data-scene=prefill] .tokens span[data-pos='3']").hover()
        lit = page.frame_locator("iframe").locator("section[data-scene=prefill] .lane[data-lane='0']")
        assert len(json.loads(lit.get_attribute("data-highlight-slots"))) == 30
        expect(page.get_by_role("button", name="Download the replay")).to_be_visible()
        page.screenshot(path=str(SCREENSHOTS / "replay_page.png"), full_page=True)
        browser.close()
    assert errors == [] and asked == [], (errors, asked)
