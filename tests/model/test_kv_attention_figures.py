"""The KV-cache and Attention figures, built from real inspection runs of the bundled model.

One ~20-token prompt is run twice (once in one step, once in chunks of 7) per module; every
figure is checked against what the engine recorded and against the KV formula
2 x 30 layers x 3 KV heads x 64 x 4 B = 46,080 B per token (fp32).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from prefillviz.analysis.attention_maps import causal_chunk_strips
from prefillviz.experiments import inspect_run, kv_memory
from prefillviz.experiments.prefill import run_prefill
from prefillviz.figures import attention as attention_figures
from prefillviz.figures import kv_cache as kv_figures
from tests.tolerances import MODEL_STEPS, OP_STEPS, allowed_difference, longest_sum

PROMPT = "The quick brown fox jumps over the lazy dog while the cat watches from the old wooden fence."
FP32_BYTES_PER_TOKEN = 46_080
MHA_BYTES_PER_TOKEN = 138_240


@pytest.fixture(scope="module")
def one_step(bundled):
    return inspect_run.run_inspection(bundled, PROMPT)


@pytest.fixture(scope="module")
def chunked(bundled):
    steps_expected = []
    run = inspect_run.run_inspection(
        bundled, PROMPT, chunk_size=7, make_progress=lambda n: steps_expected.append(n) or None
    )
    run.steps_expected = steps_expected
    return run


def test_runs_cover_the_prompt_in_the_expected_steps(one_step, chunked):
    n = one_step.num_tokens
    assert 15 <= n <= 30
    assert one_step.num_steps == 1 and one_step.chunk_size is None
    assert chunked.num_steps == math.ceil(n / 7) == chunked.steps_expected[0]
    assert inspect_run.chunk_boundaries(chunked.trace, chunked.request_id) == list(range(0, n, 7))
    assert inspect_run.chunk_boundaries(one_step.trace, one_step.request_id) == [0]


@pytest.mark.parametrize("quantity", ["key_norm", "value_norm", "bytes"])
def test_kv_heatmap_is_layers_by_positions(one_step, quantity):
    fig = kv_figures.kv_writes_heatmap(one_step.trace, one_step.request_id, quantity, one_step.token_texts)
    z = np.array(fig.data[0].z)
    assert z.shape == (30, one_step.num_tokens)
    assert list(fig.data[0].x) == list(range(one_step.num_tokens))
    assert fig.layout.yaxis.title.text == "layer"
    assert "(" in fig.data[0].colorbar.title.text  # a unit in the colorbar title
    if quantity == "bytes":  # K + V of 3 KV heads x 64 dims x 4 B, every layer and token
        assert np.all(z == 2 * 3 * 64 * 4)
    else:
        assert np.all(z > 0) and z.std() > 0
    assert len(fig.layout.xaxis.ticktext) == one_step.num_tokens  # token labels on a short prompt


def test_kv_heatmap_of_a_chunked_run_matches_the_one_step_run(bundled, one_step, chunked):
    _, one = inspect_run.kv_write_matrix(one_step.trace, one_step.request_id, "key_norm")
    positions, chunks = inspect_run.kv_write_matrix(chunked.trace, chunked.request_id, "key_norm")
    assert list(positions) == list(range(one_step.num_tokens))
    # two forwards
    allowed = allowed_difference(
        torch.float32, np.abs(one).max(), MODEL_STEPS, longest_sum(bundled.model, one_step.num_tokens)
    )
    np.testing.assert_allclose(chunks, one, rtol=0, atol=allowed)
    table = inspect_run.kv_write_table(chunked.trace, chunked.request_id, "key_norm")
    assert len(table) == 30 * one_step.num_tokens


def test_block_grid_counts_filled_partial_free(one_step, chunked):
    n = one_step.num_tokens
    for run in (one_step, chunked):
        usage = kv_memory.block_usage(run.trace, run.request_id, run.num_tokens)
        assert len(usage.block_ids) == math.ceil(n / 16)
        assert usage.num_filled == n // 16 and usage.num_partial == (1 if n % 16 else 0)
        assert usage.num_free == run.trace.num_blocks - math.ceil(n / 16)
        assert usage.tokens_in_block[-1] == n - 16 * (len(usage.block_ids) - 1)
        fig = kv_figures.block_table_figure(usage)
        z = np.array(fig.data[0].z, dtype=float)
        assert np.sum(z == 2) == usage.num_filled and np.sum(z == 1) == usage.num_partial
        assert np.sum(z == 0) == usage.num_free and np.sum(~np.isnan(z)) == run.trace.num_blocks
        for block, tokens in zip(usage.block_ids, usage.tokens_in_block):  # the engine's own block ids
            assert z[block // 32, block % 32] == (2 if tokens == 16 else 1)
        names = [trace.name for trace in fig.data[1:]]
        assert f"free: {usage.num_free:,}" in names


def test_memory_growth_ends_at_the_formula_and_matches_the_write_log(one_step, chunked):
    n = one_step.num_tokens
    for run in (one_step, chunked):
        growth = kv_memory.memory_growth(run.trace, run.request_id)
        logged = sum(s.kv_writes.bytes_per_layer * len(s.kv_writes.layers_written) for s in run.trace.steps)
        fig = kv_figures.memory_growth_figure(growth)
        measured = next(t for t in fig.data if t.name.startswith("measured"))
        formula = next(t for t in fig.data if t.name.startswith("formula"))
        assert measured.y[-1] == n * FP32_BYTES_PER_TOKEN == logged
        assert formula.y[-1] == n * FP32_BYTES_PER_TOKEN
        assert len(measured.x) == run.num_steps + 1
        np.testing.assert_allclose(measured.y, np.array(measured.x) * FP32_BYTES_PER_TOKEN)  # every step on the line
        held = next(t for t in fig.data if t.name.startswith("blocks the engine held"))
        assert held.y[-1] == math.ceil(n / 16) * 16 * FP32_BYTES_PER_TOKEN
    assert list(kv_memory.memory_growth(chunked.trace, chunked.request_id).tokens) == (
        [0] + [min(b + 7, n) for b in range(0, n, 7)]
    )


def test_gqa_bars_show_this_model_against_mha(one_step):
    report = kv_memory.memory_report(one_step)
    assert report.bytes_per_token == FP32_BYTES_PER_TOKEN == one_step.trace.kv_bytes_per_token
    assert report.num_blocks == one_step.trace.num_blocks and report.cache_num_bytes == one_step.trace.kv_cache_bytes
    fig = kv_figures.gqa_bars_figure(report)
    assert list(fig.data[0].y) == [FP32_BYTES_PER_TOKEN, MHA_BYTES_PER_TOKEN]
    assert "3x" in fig.layout.title.text
    assert fig.layout.yaxis.title.text == "KV cache per token (bytes)"


def test_attention_heatmap_small_prompt_is_exact_with_token_labels(one_step):
    captured = one_step.trace.captured_qk[one_step.request_id]
    n = one_step.num_tokens
    fig = attention_figures.attention_map_figure(
        captured.queries[3], captured.keys[3], 4, captured.scaling[3], 3, one_step.token_texts
    )
    z = np.array(fig.data[0].z, dtype=float)
    assert z.shape == (n, n)
    assert list(fig.data[0].x) == [kv_figures.token_label(i, t) for i, t in enumerate(one_step.token_texts)]
    assert np.isnan(z[0, 1]) and np.all(np.isnan(z[np.triu_indices(n, 1)]))  # masked above the diagonal
    # rows are distributions
    np.testing.assert_allclose(np.nansum(z, axis=1), 1.0, atol=allowed_difference(torch.float32, 1.0, OP_STEPS, n))
    assert "head 4 (KV head 1)" in fig.layout.title.text


def test_attention_heatmap_long_prompt_is_pooled():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((4, 1000, 16)).astype(np.float32)
    k = rng.standard_normal((2, 1000, 16)).astype(np.float32)
    strips = causal_chunk_strips([0, 400, 800], 1000)
    fig = attention_figures.attention_map_figure(q, k, 1, 0.25, 0, token_texts=["x"] * 1000, strips=strips)
    z = np.array(fig.data[0].z, dtype=float)
    assert z.shape[0] == z.shape[1] <= 256
    assert fig.data[0].x[0] == "0–3" and fig.data[0].x[-1] == "996–999"  # bin ranges, not tokens
    assert len(fig.layout.shapes) == 3


def test_head_grid_is_layers_by_heads_and_clicks_map_back(one_step):
    summaries = inspect_run.attention_summaries(one_step)
    assert summaries["entropy"].shape == summaries["sink"].shape == (30, 9)
    fig = attention_figures.head_grid_figure(summaries, selected=(2, 5))
    entropy, sink = fig.data[0], fig.data[2]
    assert len(entropy.x) == len(sink.x) == 30 * 9
    assert sorted(set(entropy.y)) == list(range(30)) and sorted(set(entropy.x)) == list(range(9))
    np.testing.assert_allclose(np.array(entropy.marker.color).reshape(30, 9), summaries["entropy"])
    np.testing.assert_allclose(np.array(sink.marker.color).reshape(30, 9), summaries["sink"])
    index = 11 * 9 + 7  # a click as Streamlit reports it: the point's own x (head) and y (layer)
    point = {
        "curve_number": 2, "point_index": index, "x": int(sink.x[index]), "y": int(sink.y[index]),
        "customdata": {"0": 1},
    }
    assert attention_figures.selected_head({"points": [point]}) == (11, 7)
    assert attention_figures.selected_head({"points": []}) is None


def test_chunk_strips_match_the_runs_chunks(chunked):
    n = chunked.num_tokens
    boundaries = inspect_run.chunk_boundaries(chunked.trace, chunked.request_id)
    strips = causal_chunk_strips(boundaries, n)
    captured = chunked.trace.captured_qk[chunked.request_id]
    fig = attention_figures.attention_map_figure(
        captured.queries[0], captured.keys[0], 0, captured.scaling[0], 0, chunked.token_texts, strips
    )
    shapes = fig.layout.shapes
    assert len(shapes) == chunked.num_steps
    for shape, start, step in zip(shapes, boundaries, chunked.trace.steps):
        end = start + step.chunks[0].num_tokens
        assert (shape.y0, shape.y1) == (start - 0.5, end - 0.5)  # the chunk's query rows
        assert (shape.x0, shape.x1) == (-0.5, end - 0.5)  # every key up to its end


def test_prefill_page_result_reads_the_same(bundled):
    result = run_prefill(bundled, PROMPT)
    run = inspect_run.from_prefill_result(result)
    assert run.source == "the Prefill page" and run.num_tokens == result.num_tokens
    usage = kv_memory.block_usage(run.trace, run.request_id, run.num_tokens)
    assert len(usage.block_ids) == math.ceil(run.num_tokens / 16)
    assert kv_memory.memory_report(run).bytes_per_token == FP32_BYTES_PER_TOKEN
