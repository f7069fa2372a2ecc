"""Sampler: greedy, temperature, top-k, top-p and seeds, on hand-made logits."""

import math

import torch

from prefillviz.engine.request import SamplingParams
from prefillviz.engine.sampler import filter_logits, sample
from tests.tolerances import OP_STEPS, allowed_difference

LOGITS = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))


def test_greedy_takes_the_argmax_and_reports_the_distribution():
    result = sample(LOGITS, SamplingParams())
    assert result.token_id == 0
    assert result.top_token_ids == [0, 1, 2, 3]
    relative = allowed_difference(torch.float32, 1.0, OP_STEPS, terms=4)  # fp32 softmax and sums over 4 logits
    assert math.isclose(sum(result.top_probs), 1.0, rel_tol=relative)
    expected_entropy = -sum(p * math.log(p) for p in [0.5, 0.25, 0.15, 0.1])
    assert math.isclose(result.entropy_nats, expected_entropy, rel_tol=relative)


def test_top_k_keeps_the_k_most_likely():
    kept = filter_logits(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert torch.isfinite(kept).tolist() == [True, True, False, False]


def test_top_p_keeps_the_smallest_set_reaching_p():
    kept = filter_logits(LOGITS, SamplingParams(temperature=1.0, top_p=0.7))
    assert torch.isfinite(kept).tolist() == [True, True, False, False]  # 0.5 < 0.7 <= 0.75
    kept = filter_logits(LOGITS, SamplingParams(temperature=1.0, top_p=0.5))
    assert torch.isfinite(kept).tolist() == [True, False, False, False]


def test_temperature_sharpens_or_flattens():
    cold = torch.softmax(filter_logits(LOGITS, SamplingParams(temperature=0.5)), -1)
    hot = torch.softmax(filter_logits(LOGITS, SamplingParams(temperature=2.0)), -1)
    assert cold[0] > 0.5 > hot[0]


def test_the_same_seed_gives_the_same_tokens_and_top_k_1_is_greedy():
    params = SamplingParams(temperature=1.0, seed=7)

    def draw(seed):
        generator = torch.Generator().manual_seed(seed)
        return [sample(LOGITS, params, generator).token_id for _ in range(50)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)
    assert set(draw(7)) == {0, 1, 2, 3}
    assert {sample(LOGITS, SamplingParams(temperature=1.0, top_k=1)).token_id for _ in range(10)} == {0}
