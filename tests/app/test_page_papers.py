"""The Reproduce the papers page and lesson 6 on the bundled model (fp32), at small sizes: each
section runs the real model, draws the paper's numbers beside ours and offers its downloads;
without .venv-vllm each "Run on vLLM too" says how to get it; every step of lesson 6 (small scale)
measures what its question asks, and its run shows on the page as the page's own runs do. The
lesson's predict, run and reveal in the walkthrough is the browser test's (tests/browser)."""

import pytest

from prefillviz.experiments import papers_published as published
from tests.app.pages import chart_specs, open_page

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LESSON = "06_reproduce_the_papers"


def texts(elements) -> str:
    return " ".join(str(element.value) for element in elements)


def test_the_page_runs_four_experiments_small_and_says_how_to_get_vllm(bundled, monkeypatch, tmp_path):
    from prefillviz.peers import vllm_client

    monkeypatch.setattr(vllm_client, "VLLM_VENV", tmp_path / "no-venv")
    app = open_page("reproduce_papers")
    assert not app.exception and app.title[0].value == "Reproduce the papers"
    assert f"commit `{published.SARATHI_COMMIT[:10]}`" in texts(app.caption)  # every source cited with its commit
    app.select_slider(key="papers_piggyback_chunk").set_value(64)
    app.multiselect(key="papers_chunk_prompts").set_value([256])
    app.multiselect(key="papers_chunk_sizes").set_value([128])
    app.multiselect(key="papers_knee_sizes").set_value([2, 4, 8])
    app.multiselect(key="papers_block_sizes").set_value([8])
    app.number_input(key="papers_prefix_tokens").set_value(16)
    app.number_input(key="papers_output_tokens").set_value(2)
    app.run()
    for button in ("papers_piggyback_run", "papers_chunk_run", "papers_knee_run", "papers_prefix_run"):
        app.button(key=button).click().run()
        assert not app.exception and not app.error, button

    results = app.session_state["results"]
    piggyback = results["papers_piggyback"]["result"]
    assert piggyback.chunk_tokens == 64 and f"({published.piggyback_ratio():,.1f}×)" in texts(app.metric)
    assert [p.chunk_size for p in results["papers_chunk_cost"]["result"].points] == [0, 128]
    assert results["papers_knee"]["result"].sizes == [2, 4, 8] and results["papers_knee"]["result"].ridge_tokens >= 1
    hits = results["papers_prefix_blocks"]["hits"]
    # one token short of a block: nothing; one block: the block
    assert hits.cached(8, 7) == 0 and hits.cached(8, 8) == 8
    assert "Block 8: prefix of 7 / 8 tokens" in [m.label for m in app.metric]

    titles = [spec["layout"]["title"]["text"] for spec in chart_specs(app).values()]
    assert len(titles) == 6  # piggyback, chunk cost, knee (two views), block hits, long outputs
    names = [trace["name"] for spec in chart_specs(app).values() for trace in spec["data"] if "name" in trace]
    assert (any(name.startswith("Sarathi-Serve, Table 2") for name in names)
            and any(name.startswith("Sarathi-Serve, Figure 9a") for name in names))
    assert any(name.startswith("Sarathi-Serve, Figure 2") for name in names)
    # piggyback, chunks, knee, prefix: each says how to get it
    assert sum("make vllm" in info.value for info in app.info) == 4
    assert not [b for b in app.button if "vllm" in (b.key or "")]  # no button that can't work
    assert len(app.get("download_button")) == 10  # a table (CSV) and the figure (HTML) for each of the 5 results


def test_every_step_of_lesson_six_measures_what_it_asks_and_shows_on_the_page(bundled):
    from prefillviz import lessons

    lesson = next(lesson for lesson in lessons.load_lessons() if lesson.slug == LESSON)
    results = {}
    for step in lesson.steps:
        action = ({**step.action, "long_prompt_sizes": [64]} if step.action["kind"] == "papers_interference"
                  else step.action)
        outcome = lessons.run_action(bundled, action, scale=0.05)
        assert set(outcome.measured) == set(lessons.ACTION_KINDS[outcome.kind].measured)
        prediction = 0 if step.question.kind == "choice" else step.question.default
        assert lessons.format_reveal(step.question, outcome.measured[step.question.answer], prediction).verdict
        assert lessons.step_after_reveal(step, outcome) and lessons.step_figure(step, outcome).data
        results.update(lessons.page_results(outcome, "timing pass · test"))
        if outcome.kind == "papers_piggyback":
            assert (outcome.measured["paper_ratio"] == published.piggyback_ratio()
                    and outcome.measured["chunk_tokens"] == 16)
            assert f"The paper measured {published.piggyback_ratio():.3g}×" in lessons.step_after_reveal(step, outcome)
        if outcome.kind == "papers_prefix_blocks":
            assert outcome.measured["one_short_cached"] == 0 and outcome.measured["one_block_cached"] == 16
        if outcome.kind == "papers_interference":
            assert outcome.measured["outputs_identical"] == 1.0
    app = open_page()
    app.session_state["results"] = results
    app.switch_page("views/reproduce_papers.py").run()
    assert not app.exception
    titles = [spec["layout"]["title"]["text"] for spec in chart_specs(app).values()]
    assert any(t.startswith("Interference") for t in titles) and any(t.startswith("Prefill in chunks") for t in titles)
    assert (any(t.startswith("Time per token of each step") for t in titles)
            and any(t.startswith("Share of the shared prefix") for t in titles))
    assert "Disaggregated beats chunking off from" in [m.label for m in app.metric]
