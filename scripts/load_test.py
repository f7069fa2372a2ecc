"""Load test: N concurrent sessions against one local server, in one of three scenarios.

    .venv/bin/python scripts/load_test.py [--scenario mixed|preset|lesson] [--sessions 8] [--url http://127.0.0.1:PORT]
                                          [--client protocol|browser] [--screenshot PNG]

    mixed   every session types its own prompt (with its own code word) and runs a prefill
    preset  every session runs the same preset: identical runs, measured once for all
    lesson  a teacher starts a class room; every session joins it by its link, runs the same
            lesson step and locks in a prediction; the teacher's histogram must count them all

Without --url it starts `streamlit run app.py` on 127.0.0.1 (a free port) and stops it at the
end. Each session is a real server session over Streamlit's websocket protocol
(scripts/streamlit_session.py: no rendering, so 30 of them fit beside the server on 2 cores), or
with --client browser its own headless Chromium context (Debian's chromium, driven by
playwright); a lesson's teacher is always a real browser. Prints completed / failed sessions,
p50 / p99 wait (time in the model queue, from the page's own "Waited ... s" note; 0 for a session
that joined another's run), click-to-result p50 / p99, the fewest timing passes behind a headline
TTFT, the runs the model actually did (sessions whose page says it measured, not joined), and
whether any session's page showed another session's code word. Traffic goes only to the loopback
address. STREAMLIT_SESSION_TRACE=1 prints each protocol session's messages and runs on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from streamlit_session import StreamlitSession

ROOT = Path(__file__).resolve().parents[1]
LOCK_IN = re.compile("Lock in my prediction")
MEASURED_ONCE = re.compile(r"Measured once for \d+ viewer")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.address", "127.0.0.1",
         "--server.port", str(port), "--server.headless", "true"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return server, url
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise SystemExit("the server did not start")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))] if ordered else float("nan")


async def one_session(browser, url: str, index: int, words: list[str], timeout_s: float) -> dict:
    context = await browser.new_context(viewport={"width": 1300, "height": 900})
    page = await context.new_page()
    result = {"session": index, "ok": False}
    try:
        await page.goto(url, timeout=timeout_s * 1000)
        prompt = page.locator("textarea").first
        await prompt.fill(f"Code word {words[index]}. The capital of France is", timeout=timeout_s * 1000)
        await prompt.press("Tab")
        await page.wait_for_timeout(300)
        start = time.perf_counter()
        await page.get_by_role("button", name="Run prefill").click()
        await page.get_by_text("Last run:").first.wait_for(timeout=timeout_s * 1000)
        await page.locator(".js-plotly-plot").nth(2).wait_for(timeout=timeout_s * 1000)
        result["run_s"] = time.perf_counter() - start
        text = await page.inner_text("body")
        waited = re.search(r"Waited ([0-9.]+) s for the shared model", text)
        result["wait_s"] = float(waited.group(1)) if waited else 0.0
        result["own_word_shown"] = words[index] in text
        result["others_words_shown"] = [w for i, w in enumerate(words) if i != index and w in text]
        result["ok"] = result["own_word_shown"]
    except Exception as error:  # reported, counted as failed
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    finally:
        await context.close()
    return result


async def preset_session(browser, url: str, index: int, timeout_s: float) -> dict:
    """The same preset in every session: its result says whether this session measured or joined."""
    context = await browser.new_context(viewport={"width": 1300, "height": 900})
    context.set_default_timeout(timeout_s * 1000)
    page = await context.new_page()
    result = {"session": index, "ok": False}
    try:
        await page.goto(url, timeout=timeout_s * 1000)
        ready = page.get_by_text("Last run:").or_(page.get_by_role("button", name="Run prefill"))
        await ready.first.wait_for(timeout=timeout_s * 1000)
        start = time.perf_counter()
        await page.get_by_role("button", name="Run prefill").click()
        await page.get_by_text("viewer(s)").first.wait_for(timeout=timeout_s * 1000)
        await read_result(page, result, start, lambda text: "Measured by this session" in text)
    except Exception as error:  # reported, counted as failed
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    finally:
        await context.close()
    return result


async def read_result(page, result: dict, start: float, measured) -> None:
    """Fill ``result`` from the page that shows its run: click-to-result time, the queue wait it reports,
    and whether this session measured (``measured(text)``) or joined another's run."""
    result["run_s"] = time.perf_counter() - start
    read_text(await page.inner_text("body"), result, measured)


def read_text(text: str, result: dict, measured) -> None:
    passes = re.search(r"TTFT: median of (\d+) timing pass", text)
    if passes:
        result["timing_passes"] = int(passes.group(1))
    waited = re.search(r"Waited ([0-9.]+) s for the shared model", text)
    result["wait_s"] = float(waited.group(1)) if waited else 0.0
    result["measured"] = measured(text)
    result["ok"] = True


async def start_room(browser, url: str, timeout_s: float):
    """The teacher's session: the Guided lessons page, a new room; returns (its page, the room code)."""
    context = await browser.new_context(viewport={"width": 1300, "height": 1000})
    context.set_default_timeout(timeout_s * 1000)  # a fresh server loads and warms the model first
    page = await context.new_page()
    await page.goto(f"{url}/walkthrough", timeout=timeout_s * 1000)
    await page.get_by_text("Class room: predict together").first.click()
    await page.get_by_role("button", name="Start a room (teacher)").click()
    heading = page.get_by_text(re.compile(r"Room code: [A-Z2-9]{5}")).first
    await heading.wait_for(timeout=timeout_s * 1000)
    code = re.search(r"Room code: ([A-Z2-9]{5})", await heading.inner_text()).group(1)
    await page.get_by_role("button", name="Next ▶").first.click()  # step 2: a number to predict (a slider)
    await page.get_by_text(re.compile(r"Step 2 of")).first.wait_for(timeout=timeout_s * 1000)
    return context, page, code


async def teacher_reveals(teacher, timeout_s: float, screenshot: str | None) -> dict:
    """The teacher's page once the class has run the step: the histogram's count, then the teacher locks in,
    runs the step (joining the class's run), reveals, and the histogram sits beside the measured answer."""
    pattern = re.compile(r"The class's predictions \((\d+) locked in\)")
    title = teacher.get_by_text(pattern).first
    await title.wait_for(timeout=timeout_s * 1000)
    found = {"teacher_histogram_counts": int(pattern.search(await title.text_content() or "").group(1))}
    await teacher.get_by_role("button", name=LOCK_IN).click()
    await teacher.get_by_role("button", name="Run this step on the model").click()
    await teacher.get_by_text(MEASURED_ONCE).first.wait_for(timeout=timeout_s * 1000)
    await teacher.get_by_role("button", name="Reveal the measured answer").click()
    # the answer marked on the histogram
    await teacher.get_by_text(re.compile(r"measured: ")).first.wait_for(timeout=timeout_s * 1000)
    if screenshot:
        chart = teacher.locator('[data-testid="stPlotlyChart"]').filter(has_text=pattern).first
        await chart.scroll_into_view_if_needed()
        await teacher.wait_for_timeout(1000)
        Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
        await chart.screenshot(path=screenshot)  # the element: Streamlit's page scrolls inside its own container
        found["screenshot"] = screenshot
    return found


async def lesson_session(browser, url: str, code: str, index: int, timeout_s: float) -> dict:
    """A student: joins the room by its link, locks in a prediction, runs the teacher's step."""
    context = await browser.new_context(viewport={"width": 1300, "height": 1000})
    context.set_default_timeout(timeout_s * 1000)
    page = await context.new_page()
    result = {"session": index, "ok": False}
    stage = "opening the room's link"
    begun = time.perf_counter()
    try:
        await page.goto(f"{url}/walkthrough?room={code}", timeout=timeout_s * 1000)
        stage = "waiting for the lock-in button"
        lock = page.get_by_role("button", name=LOCK_IN)
        await lock.wait_for(timeout=timeout_s * 1000)
        result["page_ready_s"] = time.perf_counter() - begun
        await lock.click()
        stage = "waiting for 'Locked in for the class'"
        await page.get_by_text("Locked in for the class").first.wait_for(timeout=timeout_s * 1000)
        start = time.perf_counter()
        stage = "waiting for the step's result"
        await page.get_by_role("button", name="Run this step on the model").click()
        await page.get_by_text(MEASURED_ONCE).first.wait_for(timeout=timeout_s * 1000)
        await read_result(page, result, start, lambda text: "you joined a run" not in text)
    except Exception as error:  # reported, counted as failed
        result["error"] = (f"{stage} ({time.perf_counter() - begun:.0f} s in): {type(error).__name__}: "
                           f"{str(error).splitlines()[0][:200]}")
    finally:
        await context.close()
    return result


# ---------------------------------------------------------------- the same sessions without a browser
# Each is a real session of the server, over Streamlit's websocket protocol (scripts/streamlit_session.py):
# the server does all it does for a browser tab; only the rendering is skipped.

def _failed(result: dict, stage: str, begun: float, error: Exception) -> None:
    result["error"] = (f"{stage} ({time.perf_counter() - begun:.0f} s in): {type(error).__name__}: "
                       f"{(str(error).splitlines() or [''])[0][:200]}")


async def protocol_mixed(url: str, index: int, words: list[str], timeout_s: float) -> dict:
    result, stage, begun = {"session": index, "ok": False}, "opening the page", time.perf_counter()
    try:
        async with StreamlitSession(url, timeout_s, f"session {index}") as page:
            stage = "typing the prompt"
            await page.wait_for(lambda p: p.widget("button", "Run prefill"))
            await page.set(page.widget("text_area", "Prompt"),
                           string_value=f"Code word {words[index]}. The capital of France is")
            stage = "waiting for the result"
            start = time.perf_counter()
            await page.click("Run prefill")
            await page.wait_for(lambda p: "Last run:" in p.text() and p.count("plotly_chart") >= 3)
            result["run_s"] = time.perf_counter() - start
            text = page.text(widgets=False)  # what the page shows, less the prompt box's own value
            read_text(text, result, lambda _: True)
            result["others_words_shown"] = [w for i, w in enumerate(words) if i != index and w in text]
            result["ok"] = f"Code word {words[index]}" in text
    except Exception as error:  # reported, counted as failed
        _failed(result, stage, begun, error)
    return result


async def protocol_preset(url: str, index: int, timeout_s: float) -> dict:
    result, stage, begun = {"session": index, "ok": False}, "opening the page", time.perf_counter()
    try:
        async with StreamlitSession(url, timeout_s, f"session {index}") as page:
            await page.wait_for(lambda p: p.widget("button", "Run prefill"))
            stage = "waiting for the result"
            start = time.perf_counter()
            await page.click("Run prefill")
            await page.wait_for("viewer(s)")
            result["run_s"] = time.perf_counter() - start
            read_text(page.text(), result, lambda text: "Measured by this session" in text)
    except Exception as error:  # reported, counted as failed
        _failed(result, stage, begun, error)
    return result


async def protocol_lesson(url: str, code: str, index: int, timeout_s: float) -> dict:
    """A student: joins the room by its link, moves the slider to a prediction of their own, locks it in,
    runs the teacher's step."""
    result, stage, begun = {"session": index, "ok": False}, "opening the room's link", time.perf_counter()
    try:
        async with StreamlitSession(f"{url}/walkthrough?room={code}", timeout_s, f"student {index}") as page:
            stage = "waiting for the lock-in button"
            await page.wait_for(lambda p: p.widget("button", LOCK_IN))
            result["page_ready_s"] = time.perf_counter() - begun
            slider = page.widget("slider", key="lesson_predict_")
            options = list(slider.options)  # a class's spread of guesses: around the middle, one per student
            guess = random.Random(index).gauss((len(options) - 1) / 2, len(options) / 5)
            stage = "moving the slider"
            await page.set(slider, string_array_value={"data": [options[min(len(options) - 1, max(0, round(guess)))]]})
            stage = "locking in"
            await page.click(LOCK_IN)
            await page.wait_for("Locked in for the class")
            stage = "waiting for the step's result"
            start = time.perf_counter()
            await page.click("Run this step on the model")
            await page.wait_for(MEASURED_ONCE)
            result["run_s"] = time.perf_counter() - start
            read_text(page.text(), result, lambda text: "you joined a run" not in text)
    except Exception as error:  # reported, counted as failed
        _failed(result, stage, begun, error)
    return result


async def drive(url: str, sessions: int, timeout_s: float, scenario: str = "mixed", screenshot: str | None = None,
                protocol: bool = True) -> tuple[list[dict], dict]:
    from playwright.async_api import async_playwright

    words = [f"ZEBRA{index}Q{index * 7 + 3}" for index in range(sessions)]
    extra: dict = {}
    async with async_playwright() as playwright:
        chromium = shutil.which("chromium") or "/usr/bin/chromium"
        browser = await playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        if scenario == "lesson":
            context, teacher, code = await start_room(browser, url, timeout_s)
            students = (protocol_lesson(url, code, i, timeout_s) if protocol
                        else lesson_session(browser, url, code, i, timeout_s) for i in range(sessions))
            results = await asyncio.gather(*students)
            await teacher.reload()
            extra.update(await teacher_reveals(teacher, timeout_s, screenshot))
            await context.close()
        elif scenario == "preset":
            results = await asyncio.gather(*(protocol_preset(url, i, timeout_s) if protocol
                                             else preset_session(browser, url, i, timeout_s)
                                             for i in range(sessions)))
        else:
            results = await asyncio.gather(*(protocol_mixed(url, i, words, timeout_s) if protocol
                                             else one_session(browser, url, i, words, timeout_s)
                                             for i in range(sessions)))
        await browser.close()
    return list(results), extra


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--url", default=None, help="a running server on 127.0.0.1 (default: start one)")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--scenario", choices=["mixed", "preset", "lesson"], default="mixed")
    parser.add_argument("--screenshot", default=None,
                        help="lesson: save the teacher's page with the class histogram here")
    parser.add_argument("--client", choices=["protocol", "browser"], default="protocol",
                        help="protocol (default): each session speaks Streamlit's websocket protocol, no rendering; "
                             "browser: each session is a headless Chromium (heavy: 30 of them starve a 2-core server). "
                             "The lesson's teacher is always a real browser")
    args = parser.parse_args()
    if args.url and not re.match(r"^http://(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?/?$", args.url):
        raise SystemExit("load tests only target this machine's loopback address")
    server, url = (None, args.url) if args.url else start_server()
    try:
        urllib.request.urlopen(url, timeout=10)
        results, extra = asyncio.run(drive(url, args.sessions, args.timeout_s, args.scenario, args.screenshot,
                                           args.client == "protocol"))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    done = [r for r in results if r["ok"]]
    waits, runs = [r["wait_s"] for r in done], [r["run_s"] for r in done]
    leaked = [r for r in results if r.get("others_words_shown")]
    summary = {
        "scenario": args.scenario,
        "client": args.client,
        "sessions": args.sessions,
        "completed": len(done),
        "failed": len(results) - len(done),
        "wait_s_p50": percentile(waits, 50),
        "wait_s_p99": percentile(waits, 99),
        "run_s_p50": percentile(runs, 50),
        "run_s_p99": percentile(runs, 99),
        "any_session_saw_another_prompt": bool(leaked),
        # a headline TTFT's median
        "fewest_timing_passes": min((r["timing_passes"] for r in done if "timing_passes" in r), default=None),
        "model_runs": sum(1 for r in done if r.get("measured", True)),  # mixed: every session measures its own prompt
        # lesson: link to a usable page
        "page_ready_s_p50": percentile([r["page_ready_s"] for r in results if "page_ready_s" in r], 50),
        "page_ready_s_p99": percentile([r["page_ready_s"] for r in results if "page_ready_s" in r], 99),
        **extra,
        "errors": [r["error"] for r in results if "error" in r],
    }
    print(json.dumps(summary, indent=2))
    return 0 if summary["failed"] == 0 and not leaked else 1


if __name__ == "__main__":
    sys.exit(main())
