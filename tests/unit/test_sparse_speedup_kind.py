"""The lesson step on block-sparse prefill (lessons/kinds/sparse_speedup.py) from a comparison with known
times, no model: its numbers are the comparison's, Amdahl's cap is 1 / (1 - share x skipped), and the
text after the reveal says slower where the run was slower and faster only where it was faster."""

import types

import pytest
import torch

from prefillviz import lessons
from prefillviz.experiments.sparse_prefill import SparseComparison
from prefillviz.lessons.kinds import sparse_speedup

STEP = next((lesson, s) for lesson in lessons.load_lessons() for s in lesson.steps
            if s.action["kind"] == "sparse_speedup")


def comparison(sparse_attention_s: float, sparse_ttft_s: float) -> SparseComparison:
    # dense: attention 1 s of a 4 s TTFT (a share of 0.25); 80% of attention's FLOPs skipped
    return SparseComparison("m", "cpu", "bfloat16", 4096, 0.2, 128, 0.8, 0.28, 0.0625, 0.01, True, 5,
                            1.0, sparse_attention_s, 4.0, sparse_ttft_s, "torch", 1, "a book")


def run(monkeypatch, result: SparseComparison, num_tokens: int = 4096) -> lessons.ActionOutcome:
    asked = {}

    def compare(loaded, n, keeps, runs, progress):
        asked.update(n=n, keeps=keeps, runs=runs)
        return [result]

    monkeypatch.setattr(sparse_speedup, "compare_dense_sparse", compare)
    loaded = types.SimpleNamespace(model_id="m", device=torch.device("cpu"), dtype=torch.bfloat16,
                                   info=types.SimpleNamespace(max_context=8192))
    outcome = lessons.run_action(loaded, {**STEP[1].action, "num_tokens": num_tokens})
    assert asked == {"n": num_tokens, "keeps": (0.2,), "runs": 1}
    return outcome


def test_a_slower_sparse_run_is_revealed_as_slower_with_amdahls_cap(monkeypatch):
    outcome = run(monkeypatch, comparison(sparse_attention_s=2.0, sparse_ttft_s=5.0))
    assert set(outcome.measured) == set(lessons.ACTION_KINDS["sparse_speedup"].measured)
    assert outcome.measured == pytest.approx({
        "num_tokens": 4096, "key_blocks_skipped_percent": 80, "attention_flops_skipped_percent": 80,
        "scoring_flops_percent": 6.25, "dense_ttft_s": 4, "sparse_ttft_s": 5, "dense_attention_s": 1,
        "sparse_attention_s": 2, "sparse_ttft_speedup": 0.8, "sparse_attention_speedup": 0.5,
        "attention_share_of_ttft_percent": 25,
        "amdahl_cap": 1 / (1 - 0.25 * 0.8), "amdahl_cap_no_attention": 1 / 0.75, "speedup_over_amdahl_cap": 0.64,
        "first_token_kl": 0.01, "top1_agree": 1,
    })
    question = STEP[1].question
    assert question.choices[lessons.choice_for(question, 0.8)].label == "Not faster: 1× or slower"
    text = lessons.step_after_reveal(STEP[1], outcome)
    assert "attention was **25%**" in text and "= **1.25×**" in text and "it would be 1.33×" in text
    assert "**slower than dense** here: **0.8×**\n(4 s dense, 5 s block-sparse)" in text
    assert "faster than dense" not in text and "of the cap" not in text
    assert lessons.page_results(outcome, "") == {"long_trade": [outcome.raw["sparse_speedup"]]}  # the page's table
    figure = lessons.step_figure(STEP[1], outcome)
    assert [list(bar.y) for bar in figure.data] == [[1.0, 2.0], [3.0, 3.0]]  # attention, the rest: dense, sparse
    assert figure.layout.shapes[0].y0 == pytest.approx(4 * (1 - 0.25 * 0.8))  # Amdahl's floor: 3.2 s


def test_a_faster_sparse_run_is_revealed_as_faster(monkeypatch):
    outcome = run(monkeypatch, comparison(sparse_attention_s=0.4, sparse_ttft_s=3.6))
    assert outcome.measured["sparse_ttft_speedup"] == pytest.approx(4 / 3.6)
    text = lessons.step_after_reveal(STEP[1], outcome)
    assert "**1.11× faster than dense** end to end" in text and "slower than dense" not in text
    assert "0.889 of the cap, within it" in text  # 1.11× of a cap of 1.25×


def test_a_prompt_past_the_models_context_is_refused_before_any_run(monkeypatch):
    with pytest.raises(lessons.LessonError, match="context \\(8,192\\) is shorter than 8,192 prompt tokens"):
        run(monkeypatch, comparison(2.0, 5.0), num_tokens=8192)
