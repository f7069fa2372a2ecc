"""Hosted mode (PREFILLVIZ_HOSTED=1): allow-listed models only, no local paths, bounded prompts."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from prefillviz.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.request import SamplingParams
from prefillviz.errors import ModelLoadError, RequestError
from prefillviz.hosted import hosted_policy
from prefillviz.models import load_model

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
    engine = LLMEngine(tiny_llama, None, EngineConfig(kv_cache_memory_bytes=64 * 2**20))
    tiny_llama.config.max_position_embeddings = 4096
    try:
        with pytest.raises(RequestError, match="hosted demo"):
            engine.add_request([5] * (policy.max_prompt_tokens + 1))
        with pytest.raises(RequestError, match="hosted demo"):
            engine.add_request([5] * 10, SamplingParams(max_new_tokens=policy.max_new_tokens + 1))
    finally:
        tiny_llama.config.max_position_embeddings = 512
    assert policy.limit("requests_per_workload", 50) == policy.max_requests_per_workload


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
