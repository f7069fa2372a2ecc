"""Hosted mode (PREFILLVIZ_HOSTED=1): allow-listed models only, no local paths, bounded prompts."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from prefillviz.engine.errors import ModelLoadError, RequestError
from prefillviz.engine.request import SamplingParams
from prefillviz.experiments.chunked import ChunkedWorkload
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.experiments.prefix import PrefixStream
from prefillviz.loading.hosted import hosted_policy
from prefillviz.loading.models import load_model

APP = str(Path(__file__).resolve().parents[2] / "app.py")


@pytest.fixture
def hosted(monkeypatch):
    monkeypatch.setenv("PREFILLVIZ_HOSTED", "1")


def test_hosted_mode_refuses_local_paths_and_ids_off_the_allow_list(hosted, tmp_path):
    for path in [str(tmp_path), "./models/x", "../secret", "~/model"]:
        with pytest.raises(ModelLoadError, match="Local paths are not available"):
            load_model(path, device="cpu")
    with pytest.raises(ModelLoadError, match="not available in this hosted demo"):
        load_model("openai-community/gpt2", device="cpu")


def test_hosted_mode_still_loads_the_bundled_model(hosted, bundled):
    assert load_model(device="cpu", dtype="float32").info.num_layers == 30


def test_hosted_mode_bounds_prompts_and_new_tokens(hosted, tiny_llama):
    policy = hosted_policy()
    engine = one_request_engine(tiny_llama, kv_cache_memory_bytes=64 * 2**20)  # the app's one-request engine
    tiny_llama.config.max_position_embeddings = 4096
    try:
        with pytest.raises(RequestError, match=f"prompts of up to {policy.max_prompt_tokens:,} tokens"):
            engine.add_request([5] * (policy.max_prompt_tokens + 1))
        with pytest.raises(RequestError, match=f"{policy.max_new_tokens} new tokens"):
            engine.add_request([5] * 10, SamplingParams(max_new_tokens=policy.max_new_tokens + 1))
    finally:
        tiny_llama.config.max_position_embeddings = 512
    assert policy.limit("requests_per_workload", 50) == policy.max_requests_per_workload


def test_every_engine_the_app_builds_carries_the_hosted_limits(monkeypatch, tiny_llama):
    workload = ChunkedWorkload(short_prompts=((5, 6),), short_max_new_tokens=2, long_prompt=(7, 8, 9))
    stream = PrefixStream(prompts=(("q0", (5, 6, 7)),), num_shared_prefix_tokens=2)

    def limits():
        configs = [
            one_request_engine(tiny_llama, num_tokens=16).config, workload.engine_config(True),
            stream.engine_config(True),
        ]
        return {(config.max_prompt_tokens, config.max_new_tokens) for config in configs}

    monkeypatch.setenv("PREFILLVIZ_HOSTED", "1")
    assert limits() == {(hosted_policy().max_prompt_tokens, hosted_policy().max_new_tokens)}
    monkeypatch.delenv("PREFILLVIZ_HOSTED")
    assert limits() == {(None, None)}  # on one's own machine only the context and the KV cache bound a request


def test_not_hosted_by_default(monkeypatch):
    monkeypatch.delenv("PREFILLVIZ_HOSTED", raising=False)
    assert not hosted_policy().enabled
    assert hosted_policy().limit("requests_per_workload", 50) == 50


def test_hosted_sidebar_offers_only_allowed_models(hosted, bundled):
    app = AppTest.from_file(APP, default_timeout=240)
    app.run()
    assert not app.exception
    options = app.selectbox(key="sidebar_model").options
    assert [o.split(" · ")[0] for o in options] == list(hosted_policy().allowed_model_ids)
    assert not [w for w in app.sidebar.text_input if w.key == "sidebar_custom_model"]


@pytest.mark.parametrize(
    ("space_id", "setting", "enabled"),
    [
        ("someone/prefillviz", None, True),  # a Space turns it on by itself
        ("someone/prefillviz", "0", False),  # an explicit setting overrides it
        ("someone/prefillviz", "off", False),
        (None, "1", True),
        (None, None, False),
        (None, "yse", True),  # a typo counts as on: it must not leave a public demo open
    ],
)
def test_hosted_mode_follows_the_space_and_an_explicit_setting_overrides_it(monkeypatch, space_id, setting, enabled):
    if space_id:
        monkeypatch.setenv("SPACE_ID", space_id)
    if setting is not None:
        monkeypatch.setenv("PREFILLVIZ_HOSTED", setting)
    policy = hosted_policy()
    assert policy.enabled is enabled
    assert policy.why  # the sidebar says what turned it on or off
    if space_id and enabled:
        assert "SPACE_ID" in policy.why and space_id in policy.why


def test_on_a_space_the_sidebar_fixes_device_and_dtype_and_ignores_a_link_to_others(monkeypatch, bundled):
    monkeypatch.setenv("SPACE_ID", "someone/prefillviz")
    app = AppTest.from_file(APP, default_timeout=240)
    app.query_params["device"] = "cpu"
    app.query_params["dtype"] = "bfloat16"
    app.run()
    assert not app.exception
    device, dtype = app.selectbox(key="sidebar_device"), app.selectbox(key="sidebar_dtype")
    assert device.options == ["auto"] and device.disabled and device.value == "auto"
    assert dtype.options == ["auto"] and dtype.disabled and dtype.value == "auto"
    captions = " ".join(c.value for c in app.sidebar.caption)
    assert "Hosted demo" in captions and "SPACE_ID" in captions
    assert "device" in captions and "dtype" in captions  # the link's device and dtype were ignored, and said so


def test_a_cuda_torch_that_cannot_reach_a_gpu_says_so_on_the_sidebar(monkeypatch, bundled):
    """PyPI's CUDA wheel on a host whose driver is older runs on the CPU: torch.cuda.is_available() is
    quietly False. The sidebar says so, with the reason torch gives when CUDA is started."""
    import torch

    from prefillviz.machine import devices

    def old_driver():
        raise RuntimeError("The NVIDIA driver on your system is too old (found version 11040).")

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "init", old_driver)
    devices.cuda_fallback_note.cache_clear()
    try:
        note = devices.cuda_fallback_note()
        assert (
            "built for CUDA 12.8" in note and "runs on the CPU" in note and "driver on your system is too old" in note
        )
        app = AppTest.from_file(APP, default_timeout=240)
        app.run()
        assert not app.exception
        assert any("driver on your system is too old" in w.value for w in app.sidebar.warning)
    finally:
        devices.cuda_fallback_note.cache_clear()
    monkeypatch.undo()
    assert devices.cuda_fallback_note() == ""  # this CPU build of torch: nothing to say


def test_the_warm_up_waits_for_its_turn_in_the_run_queue(monkeypatch):
    """A model loaded (and warmed up) while another session's run holds the shared model waits for
    that run to end, so the warm-up never skews another session's timings."""
    import threading
    import time
    from types import SimpleNamespace

    from prefillviz.ui import preparation
    from prefillviz.ui.run_queue import RUN_QUEUE

    events = []
    monkeypatch.setattr(preparation, "load_model", lambda *args, **kwargs: SimpleNamespace(warm_up_s=None, model=None))
    monkeypatch.setattr(preparation, "prepare_dispatch", lambda loaded, buckets=None: events.append("timing"))
    monkeypatch.setattr(preparation, "time_next_bucket", lambda model: False)
    monkeypatch.setattr(preparation, "warm_up", lambda loaded: events.append("warm-up") or 0.1)
    release = threading.Event()

    def other_sessions_run():
        with RUN_QUEUE.turn():
            events.append("run starts")
            release.wait(10)
            events.append("run ends")

    runner = threading.Thread(target=other_sessions_run)
    runner.start()
    while "run starts" not in events:
        time.sleep(0.01)
    prepared = preparation.Preparation("some-model", "cpu", "float32")  # in a thread of its own
    time.sleep(0.3)
    assert events == ["run starts"] and not prepared.ready  # the kernels' timing is waiting for its turn
    assert prepared.stage == "kernels" and "step 2 of 3: timing this machine's kernels" in prepared.text()
    release.set()
    runner.join(10)
    assert prepared.done.wait(10) and prepared.ready and prepared.error is None
    assert events == ["run starts", "run ends", "timing", "warm-up"]
