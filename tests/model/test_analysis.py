"""The analysis numbers against the real thing: torch.profiler, the engine's KV tensors,
the machine's measured peaks, and timed engine steps on the roofline."""


import pytest
import torch

from prefillviz.analysis.flops import model_costs
from prefillviz.analysis.machine_peaks import MachinePeaks
from prefillviz.analysis.memory import current_rss_bytes, kv_memory_report, peak_rss_bytes
from prefillviz.analysis.roofline import predict_layer_times, ridge_point, roof
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.loading.prompts import bench_token_ids
from prefillviz.measure import peaks_history
from prefillviz.measure.peaks_history import machine_peaks
from prefillviz.measure.roofline import measure_roofline_points

MATMUL_EVENTS = ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear")
PROFILER_RELATIVE_TOLERANCE = 1e-6  # the profiler counts 2*M*K*N per mm: it matches exactly


def test_profiler_matmul_flops_match_projections_mlp_and_one_lm_head_row(bundled):
    """What torch.profiler(with_flops=True) reports on CPU for a Llama forward:

    * aten::mm: 2*M*K*N for every q/k/v/o, gate/up/down projection and the lm_head (one
      row with logits_to_keep=1); aten::linear and aten::matmul wrap it and report 0.
    * aten::scaled_dot_product_attention / _scaled_dot_product_flash_attention_for_cpu:
      0 FLOPs, so attention is missing from the profiler's total.
    * aten::add / aten::mul report elementwise FLOPs (norms, residuals, RoPE, SiLU gate).
    """
    n = 64
    input_ids = torch.tensor([bench_token_ids(bundled.tokenizer, n)])
    with torch.inference_mode(), torch.profiler.profile(with_flops=True) as profile:
        bundled.model(input_ids, logits_to_keep=1)
    events = profile.key_averages()
    profiler_flops = sum(event.flops for event in events if event.key in MATMUL_EVENTS)

    cost = model_costs(bundled.info, n, n, dtype_bytes=4)
    expected = cost.linear_flops + cost.lm_head.flops
    assert profiler_flops == pytest.approx(expected, rel=PROFILER_RELATIVE_TOLERANCE)
    assert expected == 2 * 106_168_320 * n + 2 * 576 * 49152  # 30 layers x 3,538,944 matrix params
    sdpa_flops = sum(event.flops for event in events if "scaled_dot_product" in event.key)
    assert profiler_flops + sdpa_flops < cost.total_flops  # attention is what the profiler leaves out


def test_kv_bytes_per_token_match_the_engine_cache_tensors(bundled):
    engine = LLMEngine(bundled.model, bundled.tokenizer, EngineConfig(num_blocks=6), model_id="bundled")
    report = kv_memory_report(engine, num_tokens=100)

    assert report.bytes_per_token == 46_080 == engine.kv_bytes_per_token
    assert report.mha_bytes_per_token == 138_240
    assert report.gqa_saving_factor == 3
    assert report.total_bytes == 100 * 46_080
    assert report.cache_num_bytes == engine.kv_cache.num_bytes == engine.num_blocks * engine.config.block_size * 46_080
    assert report.bytes_per_block == 16 * 46_080
    assert report.bytes_per_block_per_layer * 30 == report.bytes_per_block
    assert "46,080" in report.formula
    assert kv_memory_report(bundled.info, "bfloat16").bytes_per_token == 23_040
    rss_now = current_rss_bytes()
    assert peak_rss_bytes() >= rss_now > 0


def test_machine_peaks_measure_then_read_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILLVIZ_CACHE", str(tmp_path))
    measured = machine_peaks("cpu", "float32")
    # plausible for any CPU this runs on: above a laptop core's scalar rate, below a GPU's
    assert 1 < measured.matmul_gflops < 100_000
    assert 0.5 < min(measured.gemv_gb_s, measured.copy_gb_s) and measured.memory_gb_s < 5_000
    assert measured.memory_gb_s == max(measured.gemv_gb_s, measured.copy_gb_s)
    assert measured.num_threads == torch.get_num_threads()
    assert list((tmp_path / "peaks").glob("*float32*.json"))

    def no_measuring(*args, **kwargs):
        raise AssertionError("the second call should read the cache")

    monkeypatch.setattr(peaks_history, "measure_peaks", no_measuring)
    assert machine_peaks("cpu", "float32") == measured
    assert measured.num_measurements == 1 and measured.other_cpu_percent is not None  # MachineLoad ran around it
    monkeypatch.setattr(
        peaks_history, "measure_peaks", lambda device, dtype: MachinePeaks("cpu", "float32", 1.0, 1.0, "now", "x", 1)
    )
    refreshed = machine_peaks("cpu", "float32", refresh=True)  # a slower measurement joins the history
    assert (refreshed.num_measurements, refreshed.matmul_gflops_min, refreshed.memory_gb_s_min) == (2, 1.0, 1.0)
    # the best stays
    assert (refreshed.matmul_gflops, refreshed.memory_gb_s) == (measured.matmul_gflops, measured.memory_gb_s)


def test_roofline_points_from_timed_engine_steps(tiny_llama):
    points = measure_roofline_points(
        (tiny_llama, None), prefill_sizes=(8, 32, 4096), decode_contexts=(16, 2048), runs=2, max_tokens=64
    )
    assert [p.label for p in points] == ["prefill N=8", "prefill N=32", "decode ctx=16"]  # 4096, 2048 over the guard
    prefill_8, prefill_32, decode = points
    # what the roofline shows: more tokens share each weight read, so a prefill step sits further
    # right (FLOPs per byte) than a decode, and a longer prefill further still
    assert decode.intensity < prefill_8.intensity < prefill_32.intensity
    assert all(p.measured_time_s > 0 and p.achieved_gflops > 0 for p in points)
    prefill_32, decode_16 = points[1], points[2]
    # what the engine ran: its own forward takes one row past the last layer's attention (of 2 layers here)
    assert prefill_32.flops == model_costs(tiny_llama, 32, 32, engine=True).total_flops < (
        model_costs(tiny_llama, 32, 32).total_flops
    )
    assert (decode_16.num_tokens, decode_16.context_len) == (1, 16)
    assert prefill_32.intensity > points[0].intensity > decode_16.intensity


def test_roof_and_ridge():
    peaks = MachinePeaks(
        "cpu", "float32", matmul_gflops=200.0, memory_gb_s=50.0, measured_at="", machine="", num_threads=2
    )
    assert ridge_point(peaks) == 4.0
    assert roof(peaks, [1.0, 4.0, 100.0]) == [50.0, 200.0, 200.0]


def test_predicted_layer_times_decode_memory_bound_prefill_compute_bound(bundled):
    peaks = MachinePeaks(
        "cpu", "bfloat16", matmul_gflops=400.0, memory_gb_s=30.0, measured_at="", machine="", num_threads=2
    )
    decode = predict_layer_times(bundled.info, 1, 1024, 2, peaks)
    assert {row["bound"] for row in decode} == {"memory"}
    prefill = {row["op"]: row for row in predict_layer_times(bundled.info, 1024, 1024, 2, peaks)}
    for op in ("q_proj", "k_proj", "v_proj", "o_proj", "mlp_gate", "mlp_up", "mlp_down"):
        assert prefill[op]["bound"] == "compute"
        assert prefill[op]["predicted_s"] == pytest.approx(prefill[op]["flops"] / 400e9)
    assert prefill["norms"]["bound"] == "memory"  # elementwise stays memory-bound at any N
