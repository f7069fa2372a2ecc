"""The Kernel timings experiments on the bundled model (fp32 CPU), short prompt: one run,
then every view of it (layer bars, op table, timeline, prediction, kernels) and its figure."""

import json

import pytest
import torch

from prefillviz.backends.dispatch_tuning import brgemm_why
from prefillviz.engine.errors import RequestError
from prefillviz.experiments import timing_rows
from prefillviz.figures import kernels as figures
from prefillviz.kernels.attention import attention_naive
from prefillviz.kernels.paged_attention import COMPILED
from prefillviz.measure import kernel_bench
from prefillviz.measure import kernels as experiments

PROMPT = "The capital of France is"
NUM_LAYERS = 30
SWEEP = (32, 96)


@pytest.fixture(scope="module")
def result(bundled):
    return experiments.run_kernel_timings(
        bundled, PROMPT, kernel_layer=7, sweep_sizes=SWEEP, timing_runs=2, kernel_runs=2
    )


def test_each_layers_parts_are_clocked_inside_it_and_other_is_the_positive_rest(result):
    # One timing pass: attention, MLP and norms each have their own clock, nested in the
    # layer's, which is read on its own. Their sum stays strictly under the layer's time:
    # the layer also runs the residual adds and the parts' hooks (a layer clock made of its
    # parts would leave nothing; a part clocked outside its layer would exceed it).
    for trace in result.timing_traces:
        times = trace.steps[0].layer_times
        for layer_s, attention_s, mlp_s, norms_s in zip(times.layer_s, times.attention_s, times.mlp_s, times.norms_s):
            assert attention_s > 0 and mlp_s > 0 and norms_s > 0
            assert attention_s + mlp_s + norms_s < layer_s
    # The bars: each layer's figures all come from its median pass (the faster of two here),
    # so "other", the layer's time left over, is what one pass measured, never below zero.
    rows = timing_rows.layer_rows(result.layer_times)
    assert [row["layer"] for row in rows] == list(range(NUM_LAYERS))
    passes = [trace.steps[0].layer_times for trace in result.timing_traces]
    for layer, (row, layer_s) in enumerate(zip(rows, result.layer_times.layer_s)):
        fastest = min(passes, key=lambda times: times.layer_s[layer])
        assert (layer_s, result.layer_times.attention_s[layer]) == (fastest.layer_s[layer], fastest.attention_s[layer])
        assert row["other_ms"] > 0  # never a negative bar
    figure = figures.layer_time_figure(rows)
    stacked = [sum(trace.y[layer] for trace in figure.data) for layer in range(NUM_LAYERS)]
    # each stacked bar is its layer's measured time
    assert stacked == pytest.approx([layer_s * 1e3 for layer_s in result.layer_times.layer_s])
    assert [trace.name for trace in figure.data][:3] == ["attention", "MLP", "norms"]
    assert all(len(trace.x) == NUM_LAYERS for trace in figure.data)
    assert figure.layout.yaxis.title.text == "time (ms)"


def test_layer_times_are_the_median_of_the_timing_passes(result):
    assert len(result.timing_traces) == 2 and all(t.capture_level == "timing" for t in result.timing_traces)
    first, second = (t.steps[0].layer_times for t in result.timing_traces)
    median_pass = first if first.layer_s[5] <= second.layer_s[5] else second  # the lower median of two
    assert result.layer_times.mlp_s[5] == median_pass.mlp_s[5] and (
        result.layer_times.norms_s[5] == median_pass.norms_s[5]
    )
    # outside the layers: a plain median
    assert result.layer_times.lm_head_s == pytest.approx((first.lm_head_s + second.lm_head_s) / 2)
    assert result.num_tokens == len(result.timing_traces[0].requests["req-0"].prompt_token_ids)


def test_op_table_has_matmuls_and_our_layer_scopes(result):
    rows = timing_rows.op_rows(result.profile)
    ops = {row["op"]: row for row in rows}
    assert (
        ops["aten::mm"]["kind"] == "torch op" and ops["aten::mm"]["gflop"] > 0
        and ops["aten::mm"]["calls"] > NUM_LAYERS
    )
    for scope in ["layers.0", "layers.29.attention", "layers.12.mlp", "lm_head"]:
        assert ops[scope]["kind"] == "our scope" and ops[scope]["calls"] == 1
    self_times = [row["self_ms"] for row in rows]
    assert self_times == sorted(self_times, reverse=True)
    figure = figures.op_table_figure(rows, top=10)
    assert sum(len(trace.x) for trace in figure.data) == 10


def test_timeline_has_every_layer_and_its_parts_in_order(result):
    events = result.timeline
    layers = [e for e in events if e["part"] == "layer"]
    assert [e["layer"] for e in layers] == list(range(NUM_LAYERS))  # one prefill: each layer once, in order
    for part in ["attention", "mlp"]:
        assert sorted(e["layer"] for e in events if e["part"] == part) == list(range(NUM_LAYERS))
    assert sum(e["part"] == "norm" for e in events) == 2 * NUM_LAYERS
    by_name = {e["name"]: e for e in events}
    outer, inner = by_name["layers.4"], by_name["layers.4.mlp"]
    assert outer["start_ms"] <= inner["start_ms"] and (
        inner["start_ms"] + inner["duration_ms"] <= outer["start_ms"] + outer["duration_ms"] + 1e-6
    )
    assert by_name["embedding"]["start_ms"] == 0 and by_name["lm_head"]["start_ms"] > by_name["layers.29"]["start_ms"]
    # read back from the Chrome trace the page offers for download: in memory, no file left behind
    assert result.profile.profile.chrome_trace_path == ""
    raw = json.loads(result.profile.profile.chrome_trace_json())["traceEvents"]
    assert any(
        e.get("name") == "layers.29.mlp" and e["dur"] / 1e3 == pytest.approx(by_name["layers.29.mlp"]["duration_ms"])
        for e in raw
    )
    figure = figures.timeline_figure(events)
    sizes = {trace.name: len(trace.x) for trace in figure.data}
    assert sizes["layer"] == sizes["attention"] == sizes["mlp"] == NUM_LAYERS and sizes["norm"] == 2 * NUM_LAYERS
    assert figure.layout.xaxis.title.text.endswith("(ms)")


def test_predicted_vs_measured_has_a_row_per_layer_and_shows_the_gap(result, bundled):
    rows = result.predicted
    assert len(rows) == NUM_LAYERS
    # same shape, same prediction; but the engine's own forward runs the last layer's o and MLP on the sampled row
    # only: less work (a short prompt's MLP reads the same weights either way, so the memory roof keeps its time)
    assert result.last_layer_rows == 1 and len({row["predicted_attention_ms"] for row in rows[:-1]}) == 1
    assert rows[-1]["predicted_attention_ms"] < rows[0]["predicted_attention_ms"] and (
        rows[-1]["predicted_mlp_ms"] <= rows[0]["predicted_mlp_ms"]
    )
    for row in rows:
        assert row["predicted_mlp_ms"] > 0 and row["measured_mlp_ms"] > 0
    figure = figures.predicted_vs_measured_figure(rows)
    assert len(figure.data) == 4 and all(len(trace.x) == NUM_LAYERS for trace in figure.data)
    measured_attention = next(trace for trace in figure.data if trace.name == "attention measured")
    # the chart shows the timing pass's figures
    assert list(measured_attention.y) == pytest.approx([s * 1e3 for s in result.layer_times.attention_s])


def test_kernels_ran_on_the_prompts_captured_layer_and_on_the_sweep(result, bundled):
    info = bundled.info
    rows = kernel_bench.kernel_rows(result.kernel_results)
    assert [row["kernel"] for row in rows] == ["v1 naive", "v2 sdpa", "v3 blocked"]
    for row in rows:
        assert row["N"] == result.kernel_num_tokens == result.num_tokens and (
            row["heads"] == f"{info.num_heads} q / {info.num_kv_heads} kv"
        )
        assert row["max_abs_diff_vs_v1"] <= row["allowed_diff"] and row["median_ms"] > 0
        assert row["peak_memory_MiB"] > 0 and row["memory_method"] == "torch.profiler allocation events"
    assert result.kernel_layer == 7
    benchmark = result.benchmark.rows()
    assert {(row["family"], row["workload"]) for row in benchmark} == {
        ("dense", "one prompt"), ("paged", "prefill"), ("paged", "mixed")
    }
    sweep = [row for row in benchmark if row["family"] == "dense"]
    assert sorted({row["N"] for row in sweep}) == list(SWEEP) and len(sweep) == 3 * len(SWEEP)
    paged = [row for row in benchmark if row["family"] == "paged"]
    # the engine's C++ kernel in its two layouts, where make built it
    compiled = ["v7 compiled", "v7 tiles"] if COMPILED.status("cpu")[0] else []
    # and v8, where oneDNN's micro-kernel runs fp32
    brgemm = [] if brgemm_why(torch.device("cpu"), torch.float32, 64) else ["v8 brgemm"]
    assert {row["kernel"] for row in paged} == {
        "v1 naive", "v2 loop", "v3 packed", "v6 loop, fp32 decodes", *compiled, *brgemm
    }  # no flex, no GPU
    assert len(paged) == (4 + len(compiled) + len(brgemm)) * 2 * len(SWEEP) and all(
        row["max_abs_diff_vs_v1"] <= row["allowed_diff"] for row in paged
    )
    mixed = next(row for row in paged if row["workload"] == "mixed" and row["N"] == 96)
    # a 96-token chunk (N < 128) + 4 decodes
    assert (mixed["queries"], mixed["context_tokens"]) == (96 + 4, 96 + 4 * 96)
    assert {s["kernel"] for s in result.benchmark.skipped} == {"v4 flex", "v5 triton", *({"v8 brgemm"} - set(brgemm))}
    assert figures.kernel_time_figure(rows).data[0].y[0] == pytest.approx(rows[0]["median_ms"])
    assert len(figures.kernel_memory_figure(rows).data) == 2
    time_lines = figures.sweep_time_figure(sweep).data
    assert len(time_lines) == 3 and all(list(line.x) == list(SWEEP) for line in time_lines)
    memory_lines = figures.sweep_memory_figure(sweep).data
    assert len(memory_lines) == 3 + 2  # measured for all three, largest intermediate for v1 and v3 (v2: unknown)


def test_the_captured_qkv_match_the_inspection_capture_and_a_prefix_is_exact(bundled):
    trace = experiments.prefill_pass(bundled, PROMPT, "inspect")
    q, k, v, scale = experiments.captured_qkv(trace, 2, "cpu", bundled.dtype)
    num_tokens = len(trace.requests["req-0"].prompt_token_ids)
    assert (
        q.shape == (9, num_tokens, 64) and k.shape == v.shape == (3, num_tokens, 64)
        and scale == pytest.approx(64**-0.5)
    )
    prefix_q, prefix_k, prefix_v, _ = experiments.captured_qkv(trace, 2, "cpu", bundled.dtype, max_tokens=3)
    assert prefix_q.shape == (9, 3, 64) and torch.equal(prefix_k, k[:, :3]) and torch.equal(prefix_v, v[:, :3])
    # causal: attention over the first 3 tokens is the first 3 rows of attention over all of them
    torch.testing.assert_close(
        attention_naive(prefix_q, prefix_k, prefix_v, scale), attention_naive(q, k, v, scale)[:, :3]
    )
    with pytest.raises(RequestError, match="Layer 30"):
        experiments.captured_qkv(trace, 30, "cpu", bundled.dtype)


def test_a_bad_prompt_or_layer_is_refused_before_anything_runs(bundled):
    with pytest.raises(RequestError, match="empty"):
        experiments.run_kernel_timings(bundled, "   ", sweep_sizes=())
    with pytest.raises(RequestError, match="Layer 99"):
        experiments.run_kernel_timings(bundled, PROMPT, kernel_layer=99, sweep_sizes=())


def test_the_timed_oracle_has_a_memory_limit_and_long_sweeps_skip_it_with_the_reason(bundled, monkeypatch):
    limit = experiments.max_kernel_tokens(bundled.info, "cpu")
    assert 9 * limit * limit * 4 <= experiments.MAX_ORACLE_SCORE_BYTES["cpu"] < 9 * (limit + 1) ** 2 * 4
    assert max(experiments.SWEEP_CHOICES["cpu"]) == 8192
    assert kernel_bench.naive_fits(9, 8192, "cpu")[0] and not kernel_bench.naive_fits(32, 8192, "cpu")[0]
    monkeypatch.setitem(kernel_bench.NAIVE_MAX_SCORE_BYTES, "cpu", 9 * 40 * 40 * 4)  # v1 up to N = 40 only
    bench = kernel_bench.run_kernel_benchmark(9, 3, 64, (32, 48), runs=1, include_flex=False)
    skipped = [(s["kernel"], s["family"], s["N"]) for s in bench.skipped if s["N"] is not None]
    assert skipped == [("v1 naive", "dense", 48), ("v1 naive", "paged", 48), ("v1 naive", "paged", 48)]
    assert "GiB" in bench.skipped[-1]["reason"]
    at_48 = [row for row in bench.rows() if row["N"] == 48]
    compiled = ["v7 compiled", "v7 tiles"] if COMPILED.status("cpu")[0] else []
    compiled += [] if brgemm_why(torch.device("cpu"), torch.float32, 64) else ["v8 brgemm"]
    assert {row["kernel"] for row in at_48} == {
        "v2 sdpa", "v3 blocked", "v2 loop", "v3 packed", "v6 loop, fp32 decodes", *compiled
    }  # checked
    with pytest.raises(RequestError, match="at least 1"):
        experiments.run_kernel_timings(bundled, PROMPT, sweep_sizes=(0,))


def test_what_tuning_buys_compares_the_two_backends_pass_for_pass(bundled):
    """Each backend's median pass: its own step's layer parts, inside its time to first token; the ratio of the two."""
    from prefillviz.experiments.tuning import compare_backends

    comparison = compare_backends(bundled, "The capital of France is", timing_runs=3)
    assert set(comparison.runs) == {"textbook", "measured"} and comparison.num_tokens == 5
    for name, run in comparison.runs.items():
        assert len(run.ttft_runs_s) == 3 and all(ms > 0 for ms in run.parts_ms.values() if ms)
        assert 0 < sum(run.parts_ms.values()) < 1e3 * run.ttft_s, name  # the layers run inside the time to first token
    assert [run.ran["backend"] for run in comparison.runs.values()] == ["torch", "measured"]
    assert comparison.speedup == comparison.runs["textbook"].ttft_s / comparison.runs["measured"].ttft_s
    assert [row["backend"] for row in comparison.rows()] == ["textbook"] * 4 + ["measured"] * 4
