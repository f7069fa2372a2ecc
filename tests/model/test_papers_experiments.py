"""The "Reproduce the papers" experiments on the bundled model: each checks what it claims.

Timing claims use medians of interleaved runs and effects far larger than a loaded 2-core
machine's noise (a decode-only step against a step of 64 tokens; 8 chunks against 2); the
mechanisms (what a prefix hit reuses) are exact, and the tokens they produce are checked against
the plain HF forward within the dtype's tolerance."""

import numpy as np
import pytest

from prefillviz.analysis.machine_peaks import MachinePeaks
from prefillviz.engine.errors import ConfigError, RequestError
from prefillviz.experiments import papers_published as published
from prefillviz.experiments.papers_chunk_cost import WHOLE, kv_reread_tokens, run_chunk_cost
from prefillviz.experiments.papers_knee import fit_knee, ridge_tokens
from prefillviz.experiments.papers_piggyback import run_piggyback
from prefillviz.experiments.papers_prefix_blocks import block_prompts, prefix_lengths, run_block_hits
from prefillviz.figures import papers as figures
from tests.hf_oracle import hf_last_logits
from tests.tolerances import assert_same_greedy_token, logits_allowed_difference

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_decode_riding_along_a_prefill_costs_less_per_token_than_in_a_decode_only_step(bundled):
    result = run_piggyback(bundled, chunk_tokens=64, runs=3)  # each step's make-up is asserted as it runs
    # a decode-only step of 4 reads every weight for 4 tokens; the mixed step for 64
    assert result.mixed_per_token_ms < result.decode_only_per_token_ms
    assert result.ratio > 2
    assert result.decode_only_ms < result.mixed_ms  # 4 tokens are cheaper than 64 in one step, even so
    assert [row["prefill_tokens"] for row in result.rows()] == [0, 64, 61] and (
        [row["decode_tokens"] for row in result.rows()] == [4, 0, 3]
    )
    assert all(len(times) == 3 for times in result.runs_ms.values())
    figure = figures.piggyback_figure(result, "t")
    paper = {(r["prefill_tokens"] > 0, r["decode_tokens"] > 0): r["per_token_ms"] for r in published.piggyback_rows()}
    # the paper's decode-only bar
    assert figure.data[0].y[0] == pytest.approx(paper[(False, True)] / paper[(True, False)])
    # ours
    assert figure.data[1].y[0] == pytest.approx(result.decode_only_per_token_ms / result.prefill_alone_per_token_ms)
    with pytest.raises(RequestError, match="C > 3"):
        run_piggyback(bundled, chunk_tokens=3)


def test_the_chunk_overhead_falls_as_the_chunk_grows(bundled):
    result = run_chunk_cost(bundled, [128], [16, 64], runs=3)
    by_chunk = {p.chunk_size: p for p in result.points}
    assert [by_chunk[c].num_steps for c in (WHOLE, 16, 64)] == [1, 8, 2]
    assert by_chunk[WHOLE].overhead == 1.0
    # 8 chunks read every weight 8 times; 2 chunks twice
    assert by_chunk[16].overhead > by_chunk[64].overhead
    assert by_chunk[16].overhead > 1.2
    assert kv_reread_tokens(256, 128) == 128 and kv_reread_tokens(256, 8) == sum(range(0, 256, 8))
    with pytest.raises(ConfigError):
        run_chunk_cost(bundled, [bundled.info.max_context + 1], [8])


def test_a_prefix_one_token_short_of_a_block_gets_no_hit_and_whole_blocks_hit(bundled):
    lengths = [15, 16, 33]
    result = run_block_hits(bundled, [16, 32], lengths)
    assert [result.cached(16, n) for n in lengths] == [0, 16, 32]
    assert [result.cached(32, n) for n in lengths] == [0, 0, 32]
    assert all(p.cached_tokens == p.expected_tokens for p in result.points)
    assert figures.block_hits_figure([result], "t").data[0].y[0] == 0.0


def test_the_second_request_decodes_from_the_hit_blocks_as_the_hf_forward_does(bundled):
    """The mechanism behind the hit: the second prompt's first token, computed after 32 cached
    tokens, is the plain forward's greedy token (within the dtype's tolerance)."""
    from prefillviz.engine.config import EngineConfig
    from prefillviz.engine.engine import LLMEngine
    from prefillviz.engine.request import SamplingParams

    first, second = block_prompts(bundled.tokenizer, bundled.info.vocab_size, 32)
    assert first[:32] == second[:32] and first[32] != second[32]
    engine = LLMEngine(bundled.model, None, EngineConfig(block_size=16, enable_prefix_caching=True, num_blocks=16))
    for request_id, prompt in (("first", first), ("second", second)):
        engine.add_request(prompt, SamplingParams(max_new_tokens=1), request_id=request_id)
        engine.run()
    record = engine.trace().requests["second"]
    assert record.num_cached_tokens == 32
    reference = hf_last_logits(bundled.model, second)
    assert_same_greedy_token(
        reference, record.output_token_ids[0], logits_allowed_difference(bundled.model, reference, len(second))
    )


def test_the_knee_fit_finds_a_hinge_and_the_ridge_moves_with_the_peaks(bundled):
    sizes = [4, 8, 16, 32, 64, 128, 256]
    times = [10.0 + 0.5 * max(0, n - 32) for n in sizes]
    fit = fit_knee(sizes, times)
    assert (
        fit.knee_tokens == pytest.approx(32) and fit.flat_ms == pytest.approx(10)
        and fit.ms_per_token == pytest.approx(0.5)
    )
    assert fit.r_squared == pytest.approx(1.0)
    flat = fit_knee(sizes, [10.0] * len(sizes))
    assert flat.ms_per_token == pytest.approx(0.0, abs=1e-9)
    low = MachinePeaks("cpu", "float32", 100.0, 20.0, "2026-12-02T00:00:00", "test", 2)  # ridge 5 FLOP/byte
    high = MachinePeaks("cpu", "float32", 300_000.0, 2_000.0, "2026-12-02T00:00:00", "test", 2)  # ridge 150 FLOP/byte
    assert 1 <= ridge_tokens(bundled, low) < ridge_tokens(bundled, high)
    with pytest.raises(ConfigError):
        fit_knee([1, 2], [1.0, 2.0])


def test_the_published_numbers_are_read_from_the_papers_files():
    assert published.piggyback_ratio() == pytest.approx(17.030523857101787 / 0.21254870853226748)
    rows = published.chunk_cost_rows()
    assert sorted({r["chunk_size"] for r in rows}) == [512, 1024, 2048, 16384] and len(rows) == 16
    assert all(r["relative"] == 1.0 for r in rows if r["chunk_size"] == 16384)
    assert [r["prefill_tokens"] for r in published.knee_rows()] == [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    model = published.distserve_interference([128, 2048], 3, 24)
    assert model[0]["ratio"] < model[1]["ratio"] and np.isfinite(model[1]["ratio"])
    for source in published.SOURCES.values():
        assert (
            (published.PAPERS_DIR / source.file).is_file() and len(source.commit) == 40 and source.model
            and source.hardware
        )
    assert prefix_lengths([16, 32])[:3] == [12, 15, 16]
