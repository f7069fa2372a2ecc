"""The server probe against a real ``vllm serve`` (vLLM's OpenAI-compatible server from
.venv-vllm, the bundled model, on 127.0.0.1): the command line's JSON, the page, a short load
sweep, and a server that stops answering mid-probe."""

import json
import subprocess
import sys
import time

import pytest

from prefillviz.peers.vllm_server import LocalVLLMServer
from prefillviz.probe.client import ProbeError
from prefillviz.probe.load_sweep import LoadSettings, load_sweep
from prefillviz.probe.report import ProbeSettings, probe_server
from tests.app.pages import chart_titled, open_page
from tests.browser.test_browser import CHROMIUM, CHROMIUM_FLAGS, SCREENSHOTS

MAX_NUM_SEQS = 4
REQUIRED_KEYS = {
    "server", "ttft_by_tokens", "prefix_miss_ttft_s", "prefix_hit_ttft_s", "prefix_hit_speedup",
    "cached_tokens_reported", "itl_max_ms_before", "itl_max_ms_during", "metrics_delta",
}


@pytest.fixture(scope="module")
def vllm_server(needs_vllm, bundled):  # bundled: its first load writes the safetensors copy vLLM reads
    # at most 4 sequences in a batch: the load sweep's 8 users make a queue on 2 cores as on a GPU
    with LocalVLLMServer(max_model_len=2048, extra_args=("--max-num-seqs", str(MAX_NUM_SEQS))) as server:
        yield server
    assert server.process.poll() is not None


@pytest.fixture(scope="module")
def probe_json(vllm_server):
    command = [
        sys.executable, "-m", "prefillviz", "probe-server", "--url", f"{vllm_server.url}/v1", "--json",
        "--sizes", "32,128,512", "--runs", "2", "--prefix-tokens", "512", "--long-tokens", "768", "--streams", "2",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_probe_json_has_every_key_and_the_servers_own_counts(probe_json, vllm_server):
    assert REQUIRED_KEYS <= set(probe_json)
    server = probe_json["server"]
    assert server["model"] == vllm_server.model_name and server["version"] and server["metrics_available"]
    assert server["max_model_len"] == 2048
    points = probe_json["ttft_by_tokens"]
    assert [p["target_tokens"] for p in points] == [32, 128, 512]
    for point in points:  # prompts sized by the server's own tokenizer, through one calibration request
        assert abs(point["num_tokens"] - point["target_tokens"]) <= 0.15 * point["target_tokens"] + 4
        assert len(point["runs"]) == 2 and point["ttft_s_median"] > 0
    assert points[-1]["ttft_s_median"] > 2 * points[0]["ttft_s_median"]  # 16x the tokens: not free
    assert probe_json["ttft_fit"]["b_s_per_token"] > 0


def test_the_prefix_hit_is_faster_and_the_server_says_it_reused_blocks(probe_json):
    assert probe_json["prefix_hit_speedup"] > 1.5, probe_json
    cached = probe_json["cached_tokens_reported"]
    assert cached is not None and 256 <= cached <= 512 + 16  # whole blocks of the 512-token prefix
    hits = probe_json["metrics_delta"]["prefix"]["vllm:prefix_cache_hits_total"]
    assert hits >= 2 * cached * 0.9  # two runs, each with one hit the server counted itself
    assert "vllm:prefix_cache_hits_total" not in probe_json["metrics_delta"]["ttft"]  # unique prompts: nothing to reuse


def test_a_long_prompt_stalls_the_other_streams(probe_json):
    before, during = probe_json["itl_max_ms_before"], probe_json["itl_max_ms_during"]
    assert before > 0 and during > before, (before, during)
    assert probe_json["ttft_long_ms"] > 0 and probe_json["long_prompt_tokens"] > 650
    assert probe_json["metrics_delta"]["interference"]["vllm:request_success_total{finished_reason=\"length\"}"] >= 1


def test_the_page_draws_the_experiments_and_keeps_them_after_an_error(vllm_server):
    app = open_page("your_server")
    app.text_input(key="probe_url").set_value(vllm_server.url)
    app.multiselect(key="probe_sizes").set_value([64, 128, 256])
    app.slider(key="probe_runs").set_value(1)
    app.slider(key="probe_streams").set_value(2)
    app.button(key="probe_run").click().run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    ttft = chart_titled(app, "Time to first token against prompt length N")
    assert [int(x) for x in ttft["data"][1]["x"]] and len(ttft["data"]) == 3  # runs, medians, the fit
    assert chart_titled(app, "A 512-token prefix sent twice")
    assert chart_titled(app, "Inter-token gaps of 2 streams")
    assert any(m.label == "Worst gap during (ms)" for m in app.metric)

    app.text_input(key="probe_url").set_value("http://127.0.0.1:9")  # nothing listens there
    app.button(key="probe_run").click().run()
    assert not app.exception
    assert any("Could not reach http://127.0.0.1:9" in e.value for e in app.error)
    assert chart_titled(app, "Time to first token against prompt length N")  # the earlier result stays


def test_the_page_in_a_real_browser(vllm_server, app_url):
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{app_url}/your_server")
        expect(page.locator("h1").first).to_contain_text("Your server", timeout=120_000)
        url_box = page.get_by_role("textbox", name="Server URL")
        url_box.fill(vllm_server.url)
        url_box.press("Enter")
        page.wait_for_timeout(1000)
        for slider in page.get_by_role("slider").all():  # runs per point and streams: their least (1), to keep it short
            slider.press("Home")
            page.wait_for_timeout(500)
        page.get_by_role("button", name="Probe the server").click()
        page.wait_for_timeout(500)
        expect(page.get_by_text("Probing:").first).to_be_visible(timeout=30_000)  # the progress bar
        expect(page.locator(".js-plotly-plot")).to_have_count(3, timeout=240_000)  # TTFT, prefix, interference
        page.wait_for_timeout(1500)
        assert not page.locator('[data-testid="stException"]').count()
        assert not page.locator('[data-testid="stAlertContentError"]').count()
        page.screenshot(path=str(SCREENSHOTS / "your_server_vllm.png"), full_page=True)
        browser.close()


def test_under_load_ttft_p99_and_the_queue_share_rise_and_the_split_matches_the_servers_ttft(vllm_server):
    """1 user, then 2 × the batch's room: the extra users wait in vLLM's queue, by its own histograms.

    The prompts are the default sweep's length (256 tokens), which the issue's 10% is about: what the
    client times beyond the server's TTFT (the HTTP round trip, the API server before the request's
    arrival stamp) is a few ms here, but 18 ms in one CI run, 10.5% of a 128-token prompt's 170 ms."""
    settings = LoadSettings(mode="concurrency", loads=(1, 2 * MAX_NUM_SEQS), requests_per_point=2 * MAX_NUM_SEQS,
                            prompt_tokens=256, prompt_spread=0.25, output_tokens=8, max_seconds=240)
    report = load_sweep(vllm_server.url, settings=settings, read_timeout_s=60)
    assert report.stopped_reason is None and len(report.points) == 2, report.stopped_reason
    one, many = (p.to_json(settings.ttft_target_s, settings.itl_target_s) for p in report.points)
    assert one["requests_ok"] == many["requests_ok"] == 2 * MAX_NUM_SEQS
    assert many["ttft_s_p99"] > 1.5 * one["ttft_s_p99"], (one, many)
    assert many["split"]["queue_share"] > one["split"]["queue_share"] + 0.2, (one["split"], many["split"])
    assert many["gauge_peaks"].get("vllm:num_requests_waiting", 0) >= 1  # seen waiting while the point ran
    for point in (one, many):
        split = point["split"]
        assert split["missing"] == [] and split["queue_s_mean"] >= 0 and split["prefill_s_mean"] > 0
        # the server's TTFT ≈ the client's, less the network
        assert 0.85 < split["server_ttft_over_client"] <= 1.02, split
        # the 10%
        assert split["before_scheduler_s_mean"] >= -0.01 and 0.9 <= split["split_over_client"] <= 1.02, split
        assert split["waiting_s_mean"] == pytest.approx(split["queue_s_mean"] + split["before_scheduler_s_mean"])
        assert point["output_tokens_per_s"] > 0 and point["prompt_tokens_per_s"] > point["output_tokens_per_s"]


def test_a_server_that_dies_mid_probe_is_a_clear_error_within_a_bounded_time(vllm_server):
    """The last test of the module: it stops the module's server (the whole group, engine core too)."""
    def kill_it(fraction, text):
        if fraction >= 0.25 and vllm_server.process.poll() is None:
            vllm_server.close()

    started = time.monotonic()
    settings = ProbeSettings(sizes=(32, 64, 128), runs=3, experiments=("ttft",))
    with pytest.raises(ProbeError, match="Could not reach|broke off|stalled"):
        probe_server(vllm_server.url, settings=settings, progress=kill_it, read_timeout_s=10)
    assert time.monotonic() - started < 60
    assert vllm_server.process.poll() is not None
