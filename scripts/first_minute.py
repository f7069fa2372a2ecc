"""A newcomer's first minute, measured: a fresh server as `make run` starts it (`--streamlit-run`: plain
`streamlit run app.py`, as a Space does) on an empty model cache (or the user's, `--warm`), opened in Debian's
chromium, with the times at which the page first shows its title, its progress bar (and each stage it names),
and a Run button that works, then the first result.

    .venv/bin/python scripts/first_minute.py [--warm] [--streamlit-run] [--json] [--screenshots DIR]

Each time counts from the first visit, made as soon as the server answers (its start is printed apart). The
app's own stage times come from the cache it wrote (`startup_seconds.json`). Needs Debian's chromium.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(cache: Path, port: int, streamlit_run: bool = False) -> tuple[subprocess.Popen, float]:
    """The app's server as `make run` starts it (``streamlit_run``: `streamlit run app.py`) with ``cache`` as
    PREFILLVIZ_CACHE; returns it and the seconds until it answered."""
    env = {**os.environ, "PREFILLVIZ_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    env.pop("PREFILLVIZ_DISPATCH_CACHE", None)  # the kernels' timings kept under the cache too (the tests set one)
    command = ["-m", "streamlit", "run", "app.py"] if streamlit_run else ["-m", "prefillviz.ui.start"]
    started = time.monotonic()
    server = subprocess.Popen(
        [sys.executable, *command, "--server.address", "127.0.0.1", "--server.port",
         str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = started + 60
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read() == b"ok":
                return server, time.monotonic() - started
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("error: streamlit did not answer within 60 s")


def first_visit(url: str, timeout_s: float = 300.0, screenshots: Path | None = None) -> dict:
    """Open ``url`` and time what a person sees, polling the page every 0.1 s; with ``screenshots``, the page at
    2 s (``at_2s.png``) and when its Run button works (``run_ready.png``) are saved there."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    seen: dict = {"stages": [], "button_labels": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        start = time.monotonic()
        page.goto(url)
        button = page.get_by_role("button", name="Run prefill")
        while time.monotonic() - start < timeout_s:
            now = round(time.monotonic() - start, 2)
            if screenshots and now >= 2.0 and "screenshot_2s_at" not in seen:
                page.screenshot(path=str(screenshots / "at_2s.png"))
                seen["screenshot_2s_at"] = now
            if "title_s" not in seen and page.locator("h1").count():
                seen["title_s"] = now
                seen["progress_with_title"] = page.locator('[data-testid="stProgress"]').count() > 0
            progress = page.locator('[data-testid="stProgress"]')
            if progress.count():
                seen.setdefault("progress_s", now)
                try:
                    text = progress.first.inner_text(timeout=1000).strip()
                except PlaywrightTimeout:  # the bar went away between the count and the read: the model is ready
                    text = ""
                # "Preparing ID, step 2 of 4: what it does (about N s left)"
                named = re.search(r"step \d+ of \d+: ([^(]+)", text)
                stage = named.group(1).strip() if named else text
                if stage and stage not in seen["stages"]:
                    seen["stages"].append(stage)
            if button.count():
                try:
                    label = button.first.inner_text(timeout=1000).strip()
                except PlaywrightTimeout:  # redrawn between the count and the read: look again next tick
                    label = ""
                if label and label not in seen["button_labels"]:
                    seen["button_labels"].append(label)
                if button.first.is_enabled() and label == "Run prefill":
                    seen["run_button_ready_s"] = now
                    if screenshots:
                        page.screenshot(path=str(screenshots / "run_ready.png"))
                    break
            page.wait_for_timeout(100)
        else:
            seen["run_button_ready_s"] = None
        if seen.get("run_button_ready_s") is not None:
            clicked = time.monotonic()
            button.first.click()
            page.get_by_text("TTFT: median of").first.wait_for(timeout=300_000)
            seen["first_result_s"] = round(seen["run_button_ready_s"] + time.monotonic() - clicked, 2)
        browser.close()
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", action="store_true", help="the user's model cache as it is, not an empty one")
    parser.add_argument("--streamlit-run", action="store_true",
                        help="start plain `streamlit run app.py` (as a Space does), not `make run`'s server")
    parser.add_argument("--screenshots", type=Path, help="save the page at 2 s and when Run works to this folder")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        print("error: Debian's chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="prefillviz-first-minute-") as empty:
        user_cache = Path(os.environ.get("PREFILLVIZ_CACHE", "~/.cache/prefillviz")).expanduser()
        cache = user_cache if args.warm else Path(empty)
        port = free_port()
        if args.screenshots:
            args.screenshots.mkdir(parents=True, exist_ok=True)
        server, server_s = start_server(cache, port, args.streamlit_run)
        try:
            result = {"cache": "warm" if args.warm else "empty",
                      "server": "streamlit run app.py" if args.streamlit_run else "make run (prefillviz.ui.start)",
                      "server_start_s": round(server_s, 2), "cpu_load_1min": os.getloadavg()[0],
                      **first_visit(f"http://127.0.0.1:{port}", screenshots=args.screenshots)}
        finally:
            server.terminate()
            server.wait(timeout=20)
        try:
            result["stage_seconds"] = json.loads((cache / "startup_seconds.json").read_text())
        except (OSError, ValueError):
            result["stage_seconds"] = None
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
