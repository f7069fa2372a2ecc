"""Every option runs on every CPU: the packing probe and its fallback, dtypes refused up front or
flagged as slow with a measured factor, the warm-up through the engine, median-of-runs TTFT.

Our machines differ in their vector units (AVX2 only, AVX-512, AVX512-BF16, AMX). On an
AVX2-only CPU oneDNN's packed bf16 linear raises; these tests force that outcome here, on
whatever CPU runs them, so the fallback is checked everywhere.
"""

import json

import pytest
import torch

from prefillviz import cli
from prefillviz.backends import dispatch_tables, llama_weights, packed_weights
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.errors import ModelLoadError
from prefillviz.experiments.prefill import load_prefill_bundle, prefill_bundle, run_prefill
from prefillviz.experiments.warm_up import warm_up
from prefillviz.machine import devices
from prefillviz.machine.devices import check_dtype
from prefillviz.measure.dtype_speed import SLOW_FACTOR, DtypeSpeed, dtype_speed
from tests.conftest import assert_matches_hf
from tests.hf_oracle import hf_last_logits
from tests.model.test_packed_weights import (  # noqa: F401 (autouse: counts packed_linear calls here too)
    OpNames,
    record_packed_calls,
)
from tests.tolerances import MODEL_STEPS, allowed_difference, longest_sum

AVX2_ERROR = (
    "mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
)


@pytest.fixture
def packing_unsupported(monkeypatch):
    """This process's packing probes answer as on an AVX2-only CPU, for every dtype: torch's packed op
    raises, and oneDNN's own matmul has no JIT kernel (so the measured dispatch has only the stock linears)."""
    monkeypatch.setattr(
        packed_weights, "cpu_runs_packed_linear", lambda dtype: (False, f"this CPU can't run it ({AVX2_ERROR})")
    )
    monkeypatch.setattr(packed_weights, "onednn_linear", lambda dtype: None)


def engine_first_logits(model, token_ids, **config):
    engine = LLMEngine(model, tokenizer=None, config=EngineConfig(**config))
    request = engine.add_request(token_ids)
    engine.run()
    return request.first_token_logits


def test_probe_turns_the_avx2_error_into_a_reason(monkeypatch):
    def raising(weight, implementation=None):
        raise RuntimeError(AVX2_ERROR)

    monkeypatch.delenv(packed_weights.FORCE_STOCK_ENV, raising=False)  # the probe must really run the op
    monkeypatch.setattr(packed_weights, "pack_weight", raising)
    ok, why = packed_weights.cpu_runs_packed_linear.__wrapped__(torch.bfloat16)  # the uncached probe
    assert not ok and "avx512bw" in why and "stock linear layers run instead" in why


def test_probe_answers_once_per_dtype_and_the_engine_follows_it():
    for dtype in (torch.float32, torch.bfloat16):
        ok, why = packed_weights.cpu_runs_packed_linear(dtype)
        # asked once
        assert packed_weights.cpu_runs_packed_linear(dtype) is packed_weights.cpu_runs_packed_linear(dtype)
        assert ok == (why == "") and (ok or "stock linear layers run" in why)
        assert packed_weights.packing_available("cpu", dtype) == (ok, why)  # what the engine, peaks and bench read
    assert not packed_weights.packing_available("cpu", torch.float16)[0]  # no packed fp16 path at all


def test_unsupported_packing_runs_stock_linears_and_still_matches_hf(tiny_llama, bundled, packing_unsupported):
    assert packed_weights.packing_status(tiny_llama) == (False, f"this CPU can't run it ({AVX2_ERROR})")
    assert "stock linear layers (this CPU can't run it" in packed_weights.linear_weights_label(
        tiny_llama, with_reason=True
    )
    prompt = list(range(3, 40))
    with packed_weights.packed_linears(tiny_llama) as packed, torch.inference_mode(), OpNames() as ops:
        tiny_llama(torch.tensor([prompt]))
    assert not packed and ops.packed == 0 and ops.stock > 0
    assert_matches_hf(tiny_llama, prompt, engine_first_logits(tiny_llama, prompt))
    real_prompt = bundled.tokenizer("The capital of France is")["input_ids"] * 4
    assert_matches_hf(bundled.model, real_prompt, engine_first_logits(bundled.model, real_prompt, token_budget=7))


def test_cli_bfloat16_runs_with_stock_linears_where_packing_is_unsupported(bundled, packing_unsupported, capsys):
    code = cli.main(
        ["run", "--prompt", "The capital of France is", "--dtype", "bfloat16", "--pack-weights", "on", "--json"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    # the greedy token is checked exactly because the fp32 model's top two logits are further apart than
    # twice what a bf16 forward may move them (its weights and activations rounded: MODEL_STEPS)
    reference = hf_last_logits(bundled.model, result["prompt_token_ids"])
    allowed = allowed_difference(
        torch.bfloat16, reference, MODEL_STEPS, longest_sum(bundled.model, result["num_prompt_tokens"])
    )
    top = reference.topk(2)
    assert float(top.values[0] - top.values[1]) > 2 * allowed and result["first_token_id"] == int(top.indices[0])
    assert result["dtype"] == "bfloat16" and result["first_token"] == " Paris"
    assert result["linear_layers"].startswith("stock linear layers (this CPU can't run it")


def test_a_dtype_whose_ops_fail_is_refused_before_the_model_loads(monkeypatch, capsys):
    def failing_ops(device, dtype):
        if dtype == torch.float16:
            raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')

    monkeypatch.setattr(devices, "_forward_ops", failing_ops)
    devices.check_dtype.cache_clear()
    try:
        assert check_dtype("cpu", torch.bfloat16) == (True, "")
        with pytest.raises(ModelLoadError, match="float16 can't run on this cpu .*Pick float32"):
            devices.require_dtype(torch.device("cpu"), torch.float16)
        code = cli.main(["run", "--prompt", "hi", "--dtype", "float16", "--model", "/no/such/folder/either"])
        err = capsys.readouterr().err
        assert code == 2 and "error: float16 can't run on this cpu" in err and "Traceback" not in err
    finally:
        devices.check_dtype.cache_clear()


def test_every_offered_dtype_runs_or_is_refused_on_this_cpu():
    for name, dtype in devices.DTYPES.items():
        runs, why = check_dtype("cpu", dtype)
        assert runs or f"{name} can't run" in why


def test_a_slow_dtype_says_so_with_its_measured_factor():
    assert dtype_speed("cpu", torch.float32).slowdown_vs_float32 == 1.0  # the reference itself is not timed
    measured = dtype_speed("cpu", torch.bfloat16)
    assert measured.dtype == "bfloat16" and "128-token" in measured.what
    assert measured.slow == (measured.slowdown_vs_float32 > SLOW_FACTOR) and measured.slow == bool(measured.note())
    slow = DtypeSpeed("cpu", "bfloat16", 3.04, "a matmul")
    assert slow.slow and slow.note().startswith(
        "bfloat16 runs 3.0x slower than float32 on this cpu (measured: a matmul)"
    )
    assert DtypeSpeed("cpu", "bfloat16", 0.6, "a matmul").note() == ""


def test_warm_up_packs_the_weights_and_the_headline_ttft_is_a_median(bundled):
    model = bundled.model
    warm_up(bundled)
    chosen = dispatch_tables.table_for(model).choice("prefill_128", "linears")  # what the warm-up's short prompt ran
    if chosen != "stock":  # the packs the first measured run would otherwise make
        # the engine's own forward packs its stacked weights (llama_weights), the stock forward its linears
        assert chosen in llama_weights._models.get(model, {}) or chosen in packed_weights._models.get(model, {})
    result = run_prefill(bundled, "The capital of France is")
    runs = result.ttft_runs_s
    assert len(runs) == 5 and sorted(runs)[2] == result.ttft_s  # the kept trace is the median run's
    assert result.machine_load is not None and 0 <= result.machine_load.other_cpu_percent <= 100
    label = result.ttft_label()
    assert (
        label.startswith("median of 5 timing passes, spread ") and "cores meanwhile" in label
        and "the measured backend's ops" in label
    )
    again = load_prefill_bundle(prefill_bundle(result))
    assert again.ttft_runs_s == runs and again.machine_load == result.machine_load


def test_the_stock_linears_switch_makes_the_probe_say_no_on_any_cpu(monkeypatch):
    monkeypatch.setenv(packed_weights.FORCE_STOCK_ENV, "1")
    ok, why = packed_weights.cpu_runs_packed_linear.__wrapped__(torch.float32)  # the uncached probe
    assert not ok and "PREFILLVIZ_STOCK_LINEARS is set" in why
    monkeypatch.setenv(packed_weights.FORCE_STOCK_ENV, "0")  # "0" is off: the probe runs the op again
    assert "PREFILLVIZ_STOCK_LINEARS" not in packed_weights.cpu_runs_packed_linear.__wrapped__(torch.float32)[1]
