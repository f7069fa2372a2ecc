"""The "Reproduce the papers" experiments on real vLLM: its prefix cache is block-granular too (a
shared prefix one token short of a block gets 0 cached tokens, one block gets the block), at its
block size 32, as on our engine; its steps of the piggyback experiment are found in its own schedule;
and the page's "Run on vLLM too" draws its TTFT sweep beside ours."""

import pytest

from prefillviz.experiments.papers_prefix_blocks import run_block_hits
from prefillviz.peers import papers_vllm

pytestmark = pytest.mark.usefixtures("needs_vllm")


def test_a_prefix_one_token_short_of_a_block_gets_no_hit_on_vllm_as_on_ours(bundled, vllm_worker):
    lengths = [31, 32, 63]
    theirs = papers_vllm.vllm_block_hits(vllm_worker, bundled.tokenizer, bundled.info.vocab_size, lengths)
    ours = run_block_hits(bundled, [32], lengths)
    assert [theirs.cached(32, n) for n in lengths] == [0, 32, 32]
    assert [p.cached_tokens for p in theirs.points] == [p.cached_tokens for p in ours.points]


def test_the_piggyback_steps_are_found_in_vllms_schedule(bundled, vllm_worker):
    result = papers_vllm.vllm_piggyback(vllm_worker, bundled.tokenizer, bundled.info.vocab_size, chunk_tokens=64,
                                        runs=1)
    # each step's make-up was found in vLLM's own schedule
    assert result.mixed_per_token_ms < result.decode_only_per_token_ms
    assert result.model_id.startswith("vLLM") and all(len(times) == 1 for times in result.runs_ms.values())


def test_the_papers_page_runs_the_knee_sweep_on_vllm_too(bundled, vllm_worker):
    from tests.app.pages import chart_specs, open_page

    app = open_page("reproduce_papers")
    app.multiselect(key="papers_knee_sizes").set_value([2, 4, 8])
    app.run()
    app.button(key="papers_knee_run").click().run()
    app.button(key="papers_knee_vllm_run").click().run()  # the app's worker: the one this session's tests share
    assert not app.exception and not app.error
    theirs = app.session_state["results"]["papers_knee_vllm"]
    assert theirs.sizes == [2, 4, 8] and theirs.model_id.startswith("vLLM")
    assert next(m.value for m in app.metric if m.label == "vLLM's knee").startswith("N ≈")
    knee = next(spec for spec in chart_specs(app).values()
                if spec["layout"]["title"]["text"].startswith("Time to first token against N"))
    assert "vLLM: TTFT (median)" in [trace.get("name") for trace in knee["data"]]
