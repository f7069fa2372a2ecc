"""Load test: N concurrent browser sessions run a prefill each against one local server.

    .venv/bin/python scripts/load_test.py [--sessions 8] [--url http://127.0.0.1:PORT]

Without --url it starts `streamlit run app.py` on 127.0.0.1 (a free port) and stops it at the
end. Each session is its own headless Chromium context (Debian's chromium, driven by
playwright), types a prompt with its own code word, clicks "Run prefill" and waits for the
charts. Prints completed / failed runs, p50 / p99 wait (time in the model queue, from the
page's own "Waited ... s" note) and run time (click to charts), and whether any session's
page showed another session's code word. Traffic goes only to the loopback address.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.address", "127.0.0.1", "--server.port", str(port),
         "--server.headless", "true"],
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


async def drive(url: str, sessions: int, timeout_s: float) -> list[dict]:
    from playwright.async_api import async_playwright

    words = [f"ZEBRA{index}Q{index * 7 + 3}" for index in range(sessions)]
    async with async_playwright() as playwright:
        chromium = shutil.which("chromium") or "/usr/bin/chromium"
        browser = await playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        results = await asyncio.gather(*(one_session(browser, url, i, words, timeout_s) for i in range(sessions)))
        await browser.close()
    return list(results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--url", default=None, help="a running server on 127.0.0.1 (default: start one)")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    if args.url and not re.match(r"^http://(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?/?$", args.url):
        raise SystemExit("load tests only target this machine's loopback address")
    server, url = (None, args.url) if args.url else start_server()
    try:
        urllib.request.urlopen(url, timeout=10)
        results = asyncio.run(drive(url, args.sessions, args.timeout_s))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    done = [r for r in results if r["ok"]]
    waits, runs = [r["wait_s"] for r in done], [r["run_s"] for r in done]
    leaked = [r for r in results if r.get("others_words_shown")]
    summary = {
        "sessions": args.sessions,
        "completed": len(done),
        "failed": len(results) - len(done),
        "wait_s_p50": percentile(waits, 50),
        "wait_s_p99": percentile(waits, 99),
        "run_s_p50": percentile(runs, 50),
        "run_s_p99": percentile(runs, 99),
        "any_session_saw_another_prompt": bool(leaked),
        "errors": [r["error"] for r in results if "error" in r],
    }
    print(json.dumps(summary, indent=2))
    return 0 if summary["failed"] == 0 and not leaked else 1


if __name__ == "__main__":
    sys.exit(main())
