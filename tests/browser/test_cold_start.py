"""A newcomer's first visit in a real browser: a fresh server as `make run` starts it, on an empty model cache.

Debian's chromium, driven by playwright, opens the app while the bundled model is dequantized, loaded, its
kernels timed and warmed up (``scripts/first_minute.py``, whose timeline this test reads). The page must show
its title and text before the model is ready, a progress bar naming each stage, a Run button that says it is
waiting, and then a Run button that works. How soon is a figure, not a pass or fail here: the benchmark
prints it (``scripts/first_minute.py``, docs/BENCHMARKS.md), and this test saves its own timeline to
out/first_minute/ (git-ignored). The warm start is ``test_browser.py``'s.
"""

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "out" / "first_minute"
_spec = importlib.util.spec_from_file_location("first_minute", ROOT / "scripts" / "first_minute.py")
first_minute = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(first_minute)


@pytest.mark.skipif(not Path(first_minute.CHROMIUM).exists(), reason="Debian's chromium is not installed")
def test_a_first_visit_on_an_empty_cache_sees_the_page_then_a_working_run_button(tmp_path):
    OUT.mkdir(parents=True, exist_ok=True)
    port = first_minute.free_port()
    server, server_s = first_minute.start_server(tmp_path / "empty-cache", port)
    try:
        seen = first_minute.first_visit(f"http://127.0.0.1:{port}", timeout_s=600, screenshots=OUT)
    finally:
        server.terminate()
        server.wait(timeout=20)
    seen |= {"server_start_s": round(server_s, 2), "cpu_load_1min": os.getloadavg()[0]}
    (OUT / "timeline.json").write_text(json.dumps(seen, indent=2))
    print(f"\nfirst visit on an empty cache: {seen}")

    # the empty cache was exercised: the first stage is the GGUF's dequantizing, and every stage was named
    assert seen["stages"][0].startswith("dequantizing the bundled model"), seen["stages"]
    assert any(stage.startswith("warming up") for stage in seen["stages"]), seen["stages"]
    # never blank: the title was on the page before the model was ready, and the Run button waited, saying so
    assert seen["title_s"] is not None and seen["run_button_ready_s"] is not None, seen
    assert seen["title_s"] < seen["run_button_ready_s"]
    assert any("model loading" in label for label in seen["button_labels"]), seen["button_labels"]
    # and then it works: the first press gives a result
    assert seen["first_result_s"] > seen["run_button_ready_s"]
