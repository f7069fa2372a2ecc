"""The engine's own forward (engine/forward.py) with each backend, and the C++ ops
(prefillviz/backends/ops/engine_ops.py).

Each way the engine can run a step (the textbook backend's plain torch, the measured backend with
and without its C++ ops, the stock transformers forward) against the others and against the plain
HF forward of each whole sequence: a mixed workload of chunked prefill, decodes packed with a
chunk, and a prefix-cache hit; fp32 and bf16 each within a few steps of its grid
(tests/tolerances.py). Then: every capture level observes the engine's own forward, unknown models
run the stock one, and the ops' own check refuses a wrong op.
"""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from prefillviz.backends import measured
from prefillviz.backends.labels import forward_label
from prefillviz.backends.measured import MEASURED
from prefillviz.backends.ops import engine_ops
from prefillviz.engine import forward
from prefillviz.engine.backend import TorchBackend
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.errors import ConfigError
from prefillviz.engine.request import SamplingParams
from prefillviz.instrument.capture import run_captured
from tests.conftest import assert_matches_hf
from tests.hf_oracle import hf_greedy_generate
from tests.tiny_models import make_tiny_llama
from tests.tolerances import (
    MODEL_STEPS,
    OP_STEPS,
    allowed_difference,
    assert_same_greedy_generation,
    assert_within,
    longest_sum,
)

WAYS = ("compiled", "measured torch ops", "textbook", "stock")


@pytest.fixture(autouse=True)
def engine_forward_allowed(monkeypatch):
    """These tests pick each way themselves, also in a suite run under PREFILLVIZ_STOCK_FORWARD=1."""
    monkeypatch.delenv(forward.STOCK_FORWARD_ENV, raising=False)


def prompt(length, vocab, seed):
    return torch.randint(3, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def engine_for(model, way, monkeypatch, **config):
    """An engine that runs a step ``way``: the measured backend with its C++ ops or with plain torch ops,
    the textbook backend, or the measured backend's stock forward (its attention inside the transformers forward)."""
    if way == "measured torch ops":
        monkeypatch.setattr(measured, "compiled_attention_status", lambda *args: (None, "off in this test"))
    backend = TorchBackend() if way == "textbook" else MEASURED
    engine = LLMEngine(model, tokenizer=None, config=EngineConfig(**config), backend=backend)
    if way == "stock":
        engine.runner.own_forward = None
    return engine


def run_mixed(model, way, monkeypatch):
    """A chunked long prompt packed with two decoding requests, then a prefix-cache hit on it."""
    engine = engine_for(model, way, monkeypatch, block_size=16, token_budget=24)
    vocab = model.config.vocab_size
    short_a, short_b, long_prompt = prompt(9, vocab, 5), prompt(13, vocab, 6), prompt(60, vocab, 7)
    hit_prompt = long_prompt[:48] + prompt(7, vocab, 8)
    engine.add_request(short_a, SamplingParams(max_new_tokens=5), request_id="a")
    engine.add_request(short_b, SamplingParams(max_new_tokens=5), request_id="b")
    engine.step()
    requests = {"long": engine.add_request(long_prompt, SamplingParams(max_new_tokens=3), request_id="long")}
    engine.run()
    requests["hit"] = engine.add_request(hit_prompt, SamplingParams(max_new_tokens=3), request_id="hit")
    trace = engine.run()
    assert trace.requests["hit"].num_cached_tokens == 48
    expected = "torch" if way == "textbook" else "measured"
    assert {step.ran["backend"] for step in trace.steps} == {expected}
    assert all(("stock forward" in step.ran["linears"]) == (way == "stock") for step in trace.steps)
    prompts = {"a": short_a, "b": short_b, "long": long_prompt, "hit": hit_prompt}
    return trace, requests, prompts


@pytest.mark.parametrize("way", WAYS)
def test_every_way_of_running_a_step_matches_hf_in_fp32(tiny_llama, way, monkeypatch, request):
    if way == "compiled":
        request.getfixturevalue("compiled_ops")
    trace, requests, prompts = run_mixed(tiny_llama, way, monkeypatch)
    for request_id in ("long", "hit"):
        assert_matches_hf(tiny_llama, prompts[request_id], requests[request_id].first_token_logits)
    for request_id, token_ids in prompts.items():
        new = len(trace.requests[request_id].output_token_ids)
        assert_same_greedy_generation(
            tiny_llama, token_ids, trace.requests[request_id].output_token_ids,
            hf_greedy_generate(tiny_llama, token_ids, new),
        )


@pytest.mark.parametrize("way", ["compiled", "textbook"])
def test_the_bundled_models_steps_match_hf_on_both_backends(bundled, way, monkeypatch, request):
    if way == "compiled":
        request.getfixturevalue("compiled_ops")
    trace, requests, prompts = run_mixed(bundled.model, way, monkeypatch)
    for request_id in ("long", "hit"):
        assert_matches_hf(bundled.model, prompts[request_id], requests[request_id].first_token_logits)


def test_bf16_ways_agree_with_the_bf16_hf_forward(monkeypatch):
    # head size 32: the ops' AVX-512 and AVX2 tiles
    model = make_tiny_llama(head_dim=32, hidden_size=128).to(torch.bfloat16)
    ways = ["measured torch ops", "textbook", "stock"]
    if engine_ops.engine_ops() is not None:
        ways.insert(0, "compiled")
    logits = {}
    for way in ways:
        with monkeypatch.context() as patch:
            _, requests, prompts = run_mixed(model, way, patch)
            logits[way] = requests["long"].first_token_logits
    for way in ways:  # bf16 rounds at other places op by op: the HF bf16 forward within a few bf16 steps
        assert_matches_hf(model, prompts["long"], logits[way])


@pytest.mark.parametrize("backend", [TorchBackend(), MEASURED], ids=["textbook", "measured"])
def test_every_capture_level_observes_the_engines_own_forward_and_leaves_no_hook(tiny_llama, monkeypatch, backend):
    """What is inspected and profiled is what is timed: the timing, inspection and profile passes all run
    the engine's own forward (its spans, and at the profile level its record_function scopes)."""
    engine = LLMEngine(tiny_llama, tokenizer=None, config=EngineConfig(), backend=backend)
    calls = []
    original = type(engine.runner.own_forward).__call__
    monkeypatch.setattr(
        type(engine.runner.own_forward), "__call__", lambda self, *args: calls.append(args[2]) or original(self, *args)
    )
    for level in ("timing", "inspect", "profile"):
        engine.add_request(prompt(20, 128, 1))
        trace = run_captured(engine, capture_level=level)
        times = trace.steps[0].layer_times
        assert times is not None and all(t > 0 for t in times.layer_s + times.attention_s + times.mlp_s + times.norms_s)
        assert times.lm_head_s > 0 and sum(times.layer_s) < trace.steps[0].wall_time_s
        if level == "profile":
            ops = {row["op"] for row in trace.profile.op_table}
            assert {"layers.0", "layers.1.attention", "layers.1.mlp", "lm_head"} <= ops  # the forward's own scopes
    assert len(calls) == 3 and None not in calls  # each level's one step ran the engine's forward, its observer told
    # transformers' own output-capturing hooks stay
    ours = [h for m in tiny_llama.modules() for h in [*m._forward_hooks.values(), *m._forward_pre_hooks.values()]
            if not getattr(h, "__module__", "").startswith("transformers.")]
    assert not ours


def test_an_inspection_pass_captures_the_same_on_every_way(tiny_llama, monkeypatch):
    ways = ["measured torch ops", "textbook", "stock"] + (["compiled"] if engine_ops.engine_ops() is not None else [])
    traces = {}
    for way in ways:
        with monkeypatch.context() as patch:
            engine = engine_for(tiny_llama, way, patch, token_budget=24)
            engine.add_request(prompt(40, 128, 3), SamplingParams(max_new_tokens=3), request_id="r")
            traces[way] = run_captured(engine, capture_level="inspect")
    stock = traces["stock"]

    # two fp32 forwards: the whole-model bound at the values' size
    def same_within_the_forwards_roundings(got, want, what):
        assert_within(
            got, want,
            allowed_difference(torch.float32, torch.as_tensor(want), MODEL_STEPS, longest_sum(tiny_llama, 40)),
            what,
        )

    for way in ways:
        trace = traces[way]
        # a chunk, the rest of the prompt, two decodes
        assert [s.num_prefill_tokens for s in trace.steps] == [24, 16, 0, 0]
        for step, reference in zip(trace.steps, stock.steps):
            for name in ("positions", "slots"):  # where each way wrote: integers, equal
                assert torch.equal(
                    torch.as_tensor(getattr(step.kv_writes, name)),
                    torch.as_tensor(getattr(reference.kv_writes, name)),
                )
            for name in ("key_norms", "value_norms"):
                same_within_the_forwards_roundings(
                    getattr(step.kv_writes, name), getattr(reference.kv_writes, name), f"{way} {name}"
                )
            same_within_the_forwards_roundings(step.hidden_norms, reference.hidden_norms, f"{way} hidden norms")
        captured, expected = trace.captured_qk["r"], stock.captured_qk["r"]
        for got, want in zip(
            captured.queries + captured.keys + captured.values, expected.queries + expected.keys + expected.values
        ):
            same_within_the_forwards_roundings(got, want, f"{way} captured q/k/v")


def test_which_forward_each_model_and_setting_gets(tiny_llama, monkeypatch):
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32)).eval()
    assert forward.own_forward_status(tiny_llama) == (True, "")
    runs, why = forward.own_forward_status(gpt2)
    assert not runs and "gpt2" in why
    assert forward_label(gpt2, with_reason=True).startswith("stock transformers forward (no engine forward for gpt2")
    assert forward_label(tiny_llama, TorchBackend()) == "engine forward, textbook ops (plain torch)"
    assert forward_label(tiny_llama, MEASURED).startswith("engine forward, measured backend")
    assert LLMEngine(gpt2, tokenizer=None, config=EngineConfig(), backend=MEASURED).runner.own_forward is None
    with pytest.raises(ConfigError, match="does not run this model \\(no engine forward for gpt2"):
        # the textbook is the Llama forward
        LLMEngine(gpt2, tokenizer=None, config=EngineConfig(), backend=TorchBackend())
    monkeypatch.setenv(forward.STOCK_FORWARD_ENV, "1")
    assert not forward.own_forward_status(tiny_llama)[0]
    assert LLMEngine(tiny_llama, tokenizer=None, config=EngineConfig(), backend=MEASURED).runner.own_forward is None


def test_the_ops_check_refuses_a_wrong_op(compiled_ops):
    assert engine_ops.self_check(compiled_ops) == ""

    class OffByALittle:
        def __getattr__(self, name):
            return getattr(compiled_ops, name)

        def silu_mul(self, gate_up):
            return compiled_ops.silu_mul(gate_up) * 1.01

    assert engine_ops.self_check(OffByALittle()) == "silu_mul, torch.float32"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("width", [576, 64, 40], ids=["the bundled model's", "one bf16 vector's", "a ragged width"])
def test_ops_match_plain_torch_on_their_one_pass_and_general_paths(compiled_ops, width, dtype):
    """A width of whole pairs of float vectors (one bf16 vector) takes each op's one-pass path (the
    bundled model's), any other the general one: both round where plain torch rounds, so they agree
    within a step apiece."""
    from prefillviz.engine.backend import rms_norm, rope, silu_mul

    generator = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(33, width, generator=generator).to(dtype) for _ in range(2))
    weight = torch.randn(width, generator=generator).to(dtype)
    summed, before = residual + x, residual.clone()
    normed = compiled_ops.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(residual, summed)  # h += x, rounded once, as torch's add
    assert_within(normed, rms_norm(summed, weight, 1e-5), allowed_difference(dtype, normed, OP_STEPS), "add_rms_norm")
    over, again = x.clone(), before.clone()  # in place (the forward's): the same bits, written over x
    assert compiled_ops.add_rms_norm(over, again, weight, 1e-5, True).data_ptr() == over.data_ptr()
    assert torch.equal(over, normed) and torch.equal(again, summed)
    gate_up = (3 * torch.randn(33, 2 * width, generator=generator)).to(dtype)
    got = compiled_ops.silu_mul(gate_up)
    assert_within(got, silu_mul(gate_up), allowed_difference(dtype, got, OP_STEPS), "silu_mul")
    heads, kv_heads, dim = 3, 1, width // 2 * 2
    qkv = torch.randn(33, (heads + 2 * kv_heads) * dim, generator=generator).to(dtype)
    angles = torch.rand(33, dim // 2, generator=generator) * 6
    cos, sin = (torch.cat([f(angles), f(angles)], dim=-1).to(dtype) for f in (torch.cos, torch.sin))
    key_cache, value_cache = (torch.zeros(3, 16, kv_heads, dim, dtype=dtype) for _ in range(2))
    slots = torch.randperm(48, generator=generator)[:33]
    want = rope(qkv.view(33, -1, dim)[:, : heads + kv_heads], cos[:, None], sin[:, None])
    rotated = qkv.clone()
    compiled_ops.rope_write_kv(rotated, cos, sin, slots, key_cache, value_cache, heads)
    got = rotated.view(33, -1, dim)[:, : heads + kv_heads]
    assert_within(got, want, allowed_difference(dtype, want, OP_STEPS), "rope")
    assert torch.equal(key_cache.view(-1, kv_heads, dim)[slots], got[:, heads:])
    assert torch.equal(value_cache.view(-1, kv_heads, dim)[slots], qkv.view(33, -1, dim)[:, heads + kv_heads :])


def test_avx512_bf16_rounding_gives_atens_bits_but_for_denormals(compiled_ops):
    """On a CPU with AVX512-BF16 the one-pass ops round floats to bf16 with its instruction
    (vcvtne2ps2bf16); above the denormals that is ATen's round to nearest even, so the bits are
    equal. A denormal float is read as zero: the one difference, and the ops' comment says so."""
    if not compiled_ops.bf16_dot_products():
        pytest.skip("no AVX512-BF16 here (or PREFILLVIZ_NO_BF16_DOT): ATen's rounding is the only one")
    generator = torch.Generator().manual_seed(3)
    width, dim, heads = 576, 64, 3
    # rows from 1e-8 to 1e8, whose products (to 1e-16 and 1e16) stay normal floats
    scales = torch.logspace(-8, 8, 33)[:, None]
    x, residual, gate_up = (
        (scales * torch.randn(33, n, generator=generator)).to(torch.bfloat16) for n in (width, width, 2 * width)
    )
    weight = torch.randn(width, generator=generator).to(torch.bfloat16)
    qkv = torch.randn(33, (heads + 2) * dim, generator=generator).to(torch.bfloat16)
    angles = torch.rand(33, dim // 2, generator=generator) * 6
    cos, sin = (torch.cat([f(angles), f(angles)], dim=-1).to(torch.bfloat16) for f in (torch.cos, torch.sin))
    outputs = {}
    try:
        for native in (True, False):
            compiled_ops.set_bf16_dot_products(native)
            summed = residual.clone()
            rotated = qkv.clone()
            caches = [torch.zeros(3, 16, 1, dim, dtype=torch.bfloat16) for _ in range(2)]
            compiled_ops.rope_write_kv(rotated, cos, sin, torch.arange(33), *caches, heads)
            outputs[native] = [
                compiled_ops.add_rms_norm(x, summed, weight, 1e-5), summed, compiled_ops.silu_mul(gate_up), rotated
            ]
            denormal = torch.full((1, 64), 3e-39).to(torch.bfloat16)
            denormal_sum = torch.zeros_like(denormal)  # 0 + a denormal, rounded to bf16
            compiled_ops.add_rms_norm(denormal, denormal_sum, torch.ones(64, dtype=torch.bfloat16), 1e-5)
            outputs[native].append(denormal_sum)
    finally:
        compiled_ops.set_bf16_dot_products(True)
    for name, native, aten in zip(["add_rms_norm", "residual", "silu_mul", "rope"], outputs[True], outputs[False]):
        assert torch.equal(native.view(torch.int16), aten.view(torch.int16)), name
    # ATen keeps it, the instruction reads zero
    assert torch.equal(outputs[False][-1], denormal) and not outputs[True][-1].any()


def test_ops_report_why_they_are_off(monkeypatch):
    engine_ops.engine_ops_status.cache_clear()
    try:
        monkeypatch.setenv(engine_ops.DISABLE_ENV, "1")
        ops, why = engine_ops.engine_ops_status()
        assert ops is None and engine_ops.DISABLE_ENV in why
        monkeypatch.delenv(engine_ops.DISABLE_ENV)
        monkeypatch.setattr(engine_ops, "build_name", lambda cap=None: "prefillviz_engine_ops_never_built")
        engine_ops.engine_ops_status.cache_clear()
        ops, why = engine_ops.engine_ops_status()
        assert ops is None and "not built" in why and "make install" in why
    finally:
        engine_ops.engine_ops_status.cache_clear()


def test_the_stacked_weights_are_made_again_when_a_weight_changes():
    from prefillviz.backends.dispatch import STOCK
    from prefillviz.backends.llama_weights import llama_weights

    model = make_tiny_llama()
    first = llama_weights(model, STOCK)
    assert llama_weights(model, STOCK) is first  # asked at every step: kept while nothing changed
    layer = model.model.layers[1]
    with torch.no_grad():
        layer.mlp.up_proj.weight.mul_(0.5)  # an in-place write
    second = llama_weights(model, STOCK)
    assert second is not first
    # another parameter in its place
    layer.self_attn.o_proj.weight = torch.nn.Parameter(layer.self_attn.o_proj.weight.detach() * 2)
    third = llama_weights(model, STOCK)
    assert third is not second
    layer.mlp.down_proj = torch.nn.Linear(128, 64, bias=False)  # another module in its place
    assert llama_weights(model, STOCK) is not third
