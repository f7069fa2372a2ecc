"""``sparse`` and ``wall`` from the command line: bad sizes are one error line before any work, and a small
``sparse`` run prints the issue's keys."""

import json

import pytest

from prefillviz.cli import main
from prefillviz.experiments.long_text import long_prompt_ids
from tests.hf_oracle import hf_last_logits
from tests.tolerances import logits_allowed_difference

SPARSE_KEYS = ["attention_flops_skipped_fraction", "tiles_kept_fraction", "first_token_kl", "top1_agree",
               "greedy_agree_32", "dense_attention_s", "sparse_attention_s", "dense_ttft_s", "sparse_ttft_s", "backend"]


@pytest.mark.parametrize("argv, message", [
    (["sparse", "--keep", "0"], "--keep 0: each fraction of key blocks kept must be in (0, 1]"),
    (["sparse", "--keep", "0.5,x"], "--keep 0.5,x: must be comma-separated numbers"),
    (["sparse", "--tokens", "0"], "--tokens 0: must be at least 1"),
    (["wall", "--sizes", "512,512,1024"], "need at least 3 different positive prompt lengths"),
])
def test_bad_options_are_refused_before_the_model_loads(argv, message, capsys, monkeypatch):
    monkeypatch.setattr("prefillviz.loading.models.load_model", lambda *a, **k: pytest.fail("the model loaded"))
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_past_the_context_is_refused_before_any_run(bundled, capsys, monkeypatch):
    monkeypatch.setattr("prefillviz.measure.long_prompts.compare_dense_sparse", lambda *a, **k: pytest.fail("ran"))
    assert main(["sparse", "--tokens", "8161", "--dtype", "float32"]) == 2
    assert "use --tokens 8160 or less" in capsys.readouterr().err


def test_a_small_sparse_run_prints_the_keys(bundled, capsys):
    assert main(["sparse", "--tokens", "300", "--keep", "1.0", "--runs", "1", "--dtype", "float32", "--json"]) == 0
    reference = hf_last_logits(bundled.model, long_prompt_ids(bundled.tokenizer, 300))  # fp32, as the run
    allowed = logits_allowed_difference(bundled.model, reference, 300)  # each run's logits within it of HF's
    result = json.loads(capsys.readouterr().out)
    assert list(result)[: len(SPARSE_KEYS)] == SPARSE_KEYS
    assert result["attention_flops_skipped_fraction"] == 0 and result["tiles_kept_fraction"] == 1
    assert result["top1_agree"] is True and result["greedy_agree_32"] == 32
    assert result["top1_agree_prompts"] == result["quality_prompts"] == 4  # the book's first four stretches of 300
    assert len(result["first_token_kl_prompts"]) == 4 and max(result["first_token_kl_prompts"]) <= 4 * allowed
    assert result["first_token_kl"] <= 4 * allowed  # |log p - log q| <= 2 x 2 allowed bounds the KL
