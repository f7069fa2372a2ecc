"""Capture levels on real runs: attention maps rebuilt from captured q/k equal eager attention,
the KV write log covers every position of every layer once, profiler scopes and Chrome trace,
hooks gone after errors, traces saved and reloaded."""

import json
import tempfile
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from prefillviz.analysis.attention_maps import attention_probs
from prefillviz.analysis.first_token import first_token_view
from prefillviz.backends.measured import STOCK_LINEARS
from prefillviz.backends.ops.brgemm_linear import BRGEMM_SCOPE, SLAB_SCOPE
from prefillviz.backends.packed_weights import ONEDNN_SCOPE
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.errors import ConfigError
from prefillviz.engine.request import SamplingParams
from prefillviz.instrument.capture import run_captured
from prefillviz.instrument.trace_io import load_trace, save_trace, trace_summary
from tests.tolerances import OP_STEPS, allowed_difference, maps_allowed_difference

TEXT = "Prefill writes the keys and values of every prompt token into the cache, layer by layer."


@contextmanager
def eager(model):
    previous = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        yield
    finally:
        model.config._attn_implementation = previous


def eager_attentions(model, token_ids):
    with eager(model), torch.inference_mode():
        return model(torch.tensor([token_ids]), output_attentions=True).attentions


def inspect_run(loaded, token_budget, max_new_tokens=1):
    engine = LLMEngine(loaded.model, loaded.tokenizer, EngineConfig(token_budget=token_budget, block_size=16))
    request = engine.add_request(TEXT, SamplingParams(max_new_tokens=max_new_tokens))
    return engine, run_captured(engine, capture_level="inspect"), request


def all_hooks(model):
    """Our hooks still on the model (transformers keeps some hooks of its own)."""
    return [
        (name, hook.__qualname__)
        for name, module in model.named_modules()
        for hooks in (module._forward_hooks, module._forward_pre_hooks)
        for hook in hooks.values()
        if "Capture" in getattr(hook, "__qualname__", "")
    ]


@pytest.fixture(scope="module")
def chunked_inspect(bundled):
    return inspect_run(bundled, token_budget=7, max_new_tokens=3)


def test_maps_from_a_chunked_capture_match_eager_attention(bundled, chunked_inspect):
    _, trace, request = chunked_inspect
    token_ids = request.prompt_token_ids
    captured = trace.captured_qk[request.request_id]
    n = len(token_ids)
    assert captured.positions[:n].tolist() == list(range(n))
    reference = eager_attentions(bundled.model, token_ids)
    worst = 0.0
    for layer in range(bundled.info.num_layers):
        q, k = captured.queries[layer][:, :n], captured.keys[layer][:, :n]
        for head in range(bundled.info.num_heads):
            ours = attention_probs(q, k, head, captured.scaling[layer])
            worst = max(worst, (ours - reference[layer][0, head]).abs().max().item())
    # the engine's packed (oneDNN) projections sum in another order than the stock matmul, layer after layer
    allowed = maps_allowed_difference(bundled.model, n)
    assert worst <= allowed, f"max |rebuilt - eager| = {worst:.2e} > {allowed:.2e}"


def test_kv_write_log_covers_every_position_of_every_layer_exactly_once(bundled, chunked_inspect):
    engine, trace, request = chunked_inspect
    num_layers = bundled.info.num_layers
    written = []
    for step in trace.steps:
        log = step.kv_writes
        assert log.layers_written == list(range(num_layers))
        assert log.key_norms.shape == (num_layers, len(log.positions), bundled.info.num_kv_heads)
        assert log.bytes_per_layer == 2 * len(log.positions) * bundled.info.num_kv_heads * bundled.info.head_dim * 4
        assert (log.blocks == log.slots // 16).all()
        assert (log.key_norms > 0).all() and (log.value_norms > 0).all()
        assert step.hidden_norms.shape == (num_layers + 1, len(log.positions))
        written.extend(log.positions.tolist())
    total = request.num_prompt_tokens + 2  # the last sampled token is never fed back
    assert sorted(written) == list(range(total))
    assert [step.num_prefill_tokens for step in trace.steps[:2]] == [7, 7]


def test_timing_level_times_every_layer_and_breaks_down_ttft(bundled):
    engine = LLMEngine(bundled.model, bundled.tokenizer, EngineConfig())
    request = engine.add_request(TEXT)
    trace = run_captured(engine, capture_level="timing")
    step = trace.steps[0]
    times = step.layer_times
    assert step.capture_level == "timing" and times.clock == "perf_counter"
    assert len(times.layer_s) == bundled.info.num_layers
    assert all(t > 0 for t in times.attention_s + times.mlp_s + times.norms_s)
    assert all(
        a + m + n <= total for a, m, n, total in zip(times.attention_s, times.mlp_s, times.norms_s, times.layer_s)
    )
    assert sum(times.layer_s) + times.lm_head_s <= step.forward_time_s
    record = trace.requests[request.request_id]
    parts = record.ttft_breakdown_s
    assert parts["forward_s"] == pytest.approx(step.forward_time_s)
    assert parts["total_s"] == pytest.approx(parts["tokenize_s"] + record.time_to_first_token_s + parts["detokenize_s"])
    assert record.first_token_text == bundled.tokenizer.decode(record.output_token_ids[:1])
    assert all(step.layer_times is None for step in LLMEngine(bundled.model, None).run().steps)


def test_profile_level_has_scopes_op_table_and_a_chrome_trace(bundled, tmp_path):
    engine = LLMEngine(bundled.model, bundled.tokenizer, EngineConfig())
    engine.add_request(TEXT)
    trace = run_captured(engine, capture_level="profile", profile_dir=str(tmp_path))
    ops = {row["op"]: row for row in trace.profile.op_table}
    for scope in [
        "layers.0.attention", "layers.29.mlp", "layers.3.input_layernorm", "layers.3.post_attention_layernorm",
        "lm_head",
    ]:
        assert ops[scope]["calls"] == 1
    linears = sum(type(m) is torch.nn.Linear for m in bundled.model.modules())
    chosen = trace.steps[0].ran["linears"]  # what the measured dispatch ran for this step's shape
    if chosen != "stock":
        # the engine's packed linears, as they ran on a CPU that packs: q|k|v, o, gate|up, down a layer, the lm_head
        packed_op = {"oneDNN matmul": ONEDNN_SCOPE, "brgemm linear": BRGEMM_SCOPE, "slab linear": SLAB_SCOPE}.get(
            chosen, "mkldnn::_linear_pointwise"
        )
        assert ops[packed_op]["calls"] == 4 * bundled.info.num_layers + 1
    else:  # stock linears where the probe said no (F.linear: addmm/mm/linear in the op table)
        assert "mkldnn::_linear_pointwise" not in ops and (
            sum(ops.get(op, {}).get("calls", 0) for op in ("aten::mm", "aten::addmm")) >= linears
        )
    events = json.loads((tmp_path / "chrome_trace.json").read_text())["traceEvents"]
    names = {event.get("name") for event in events}
    assert {"layers.0", "layers.29", "layers.15.mlp"} <= names
    assert trace.profile.chrome_trace_json() == (tmp_path / "chrome_trace.json").read_bytes()  # the file, and in memory
    assert not all_hooks(bundled.model)


def test_profile_level_counts_matmul_flops_of_stock_linears(bundled):
    engine = LLMEngine(bundled.model, bundled.tokenizer, EngineConfig(), backend=STOCK_LINEARS)
    engine.add_request(TEXT)
    ops = {row["op"]: row for row in run_captured(engine, capture_level="profile").profile.op_table}
    assert ops["aten::mm"]["flops"] > 0 and "mkldnn::_linear_pointwise" not in ops


def test_profile_without_a_folder_keeps_the_chrome_trace_in_memory_and_leaves_no_temp_folder(
    bundled, tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where TemporaryDirectory would leave one
    engine = LLMEngine(bundled.model, bundled.tokenizer, EngineConfig())
    engine.add_request(TEXT)
    trace = run_captured(engine, capture_level="profile")
    assert trace.profile.chrome_trace_path == "" and not list(tmp_path.iterdir())
    assert "layers.29.mlp" in {
        event.get("name") for event in json.loads(trace.profile.chrome_trace_json())["traceEvents"]
    }
    loaded = load_trace(save_trace(trace, tmp_path / "saved"))  # written as its own file, read back into memory
    assert loaded.profile.chrome_trace_json() == trace.profile.chrome_trace_json()


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("own_forward", [True, False], ids=["engine forward", "stock forward"])
def test_hooks_and_scopes_are_removed_when_a_captured_run_fails(bundled, own_forward):
    engine = LLMEngine(bundled.model, bundled.tokenizer, EngineConfig())
    if not own_forward:
        engine.runner.own_forward = None  # a model the engine's forward does not know: the capture hooks its modules
    backend = engine.runner.backend

    class FailInLayer4:  # the engine's backend, its attention failing in layer 4
        name = backend.name

        def __getattr__(self, name):
            return getattr(backend, name)

        def for_step(self, model, meta):
            ops = backend.for_step(model, meta)
            attention = ops.attention


            def failing(layer, *args):
                if layer == 4:
                    raise Boom("failed inside layer 4")
                return attention(layer, *args)

            ops.attention = failing
            return ops

    engine.runner.backend = FailInLayer4()
    engine.add_request(TEXT)
    for level in ["timing", "inspect", "profile"]:
        with pytest.raises(Boom):
            run_captured(engine, capture_level=level)
        assert not all_hooks(bundled.model) and engine.observer is None
        assert not torch._C._autograd._profiler_enabled()  # the profile level's profiler stopped
        engine.add_request(TEXT)
    engine.runner.backend = backend
    assert run_captured(engine, capture_level="timing").steps[-1].layer_times is not None


def test_unknown_capture_level_is_refused(bundled):
    engine = LLMEngine(bundled.model, bundled.tokenizer)
    engine.add_request(TEXT)
    with pytest.raises(ConfigError, match="capture level"):
        run_captured(engine, capture_level="everything")


def test_saved_trace_reloads_with_the_same_maps_and_numbers(chunked_inspect, tmp_path):
    _, trace, request = chunked_inspect
    loaded = load_trace(save_trace(trace, tmp_path / "run"))
    assert trace_summary(loaded) == trace_summary(trace)
    before, after = trace.captured_qk[request.request_id], loaded.captured_qk[request.request_id]
    for layer in (0, 17, 29):
        for head in (0, 8):
            assert torch.equal(
                attention_probs(before.queries[layer], before.keys[layer], head, before.scaling[layer]),
                attention_probs(after.queries[layer], after.keys[layer], head, after.scaling[layer]),
            )
    np.testing.assert_array_equal(loaded.steps[2].kv_writes.key_norms, trace.steps[2].kv_writes.key_norms)
    np.testing.assert_array_equal(
        loaded.requests[request.request_id].first_token_logits, trace.requests[request.request_id].first_token_logits
    )


def test_first_token_view_resamples_from_kept_logits(chunked_inspect):
    _, trace, request = chunked_inspect
    record = trace.requests[request.request_id]
    greedy = first_token_view(record.first_token_logits, SamplingParams(), record.output_token_ids[0])
    assert greedy.sampled_token_rank == 1 and greedy.greedy_token_id == record.output_token_ids[0]
    assert greedy.greedy.top_token_ids == record.first_token_top_ids
    vocabulary = len(record.first_token_logits)  # the entropy is a sum over it, here and in the engine, in fp32
    assert greedy.greedy.entropy_nats == pytest.approx(
        record.first_token_entropy_nats, rel=allowed_difference(torch.float32, 1.0, OP_STEPS, vocabulary)
    )
    hot = first_token_view(record.first_token_logits, SamplingParams(temperature=1.5, top_k=5), seed=3)
    assert hot.sampling.num_candidates == 5 and hot.sampled_token_id in hot.sampling.top_token_ids
    assert hot.sampling.entropy_nats < hot.greedy.entropy_nats  # only 5 candidates left
    assert hot.sampled_token_rank <= 5
    nucleus = first_token_view(record.first_token_logits, SamplingParams(temperature=1.0, top_p=0.5))
    kept = nucleus.sampling.num_candidates
    # fp32 sums of probabilities
    assert sum(nucleus.greedy.top_probs[: kept - 1]) < 0.5 + allowed_difference(torch.float32, 1.0, OP_STEPS, kept)
