"""The side-by-side diff on two runs of our own engine (tiny model, no vLLM): it must see every
kind of difference, or the peer tier's "the same" would mean nothing."""

import copy

from prefillviz.peers import side_by_side
from prefillviz.peers.workload import PeerRequest


def workload(arrival=1):
    return [PeerRequest("a", list(range(3, 40)), 4), PeerRequest("b", list(range(50, 60)), 4, arrival_step=arrival)]


def test_the_same_run_twice_is_the_same_in_everything(tiny_llama):
    first = side_by_side.run_ours(tiny_llama, None, workload(), token_budget=16)
    second = side_by_side.run_ours(tiny_llama, None, workload(), token_budget=16)
    comparison = side_by_side.compare(first, second)
    assert comparison.all_equal and comparison.outputs_equal == ["a", "b"]
    # a's 37 prompt tokens in chunks of the budget; b (arrived at step 1) joins when a's last chunk leaves room
    assert side_by_side.schedule(first) == [{"a": 16}, {"a": 16}, {"a": 5, "b": 10}] + [{"a": 1, "b": 1}] * 3


def test_another_budget_changes_the_schedule_and_the_diff_says_where(tiny_llama):
    ours = side_by_side.run_ours(tiny_llama, None, workload(), token_budget=16)
    other = side_by_side.run_ours(tiny_llama, None, workload(), token_budget=64)
    comparison = side_by_side.compare(ours, other)
    assert comparison.outputs_differ == [] and not comparison.schedule_equal  # the same tokens, another schedule
    step, mine, theirs = comparison.first_schedule_difference
    assert (step, mine, theirs) == (0, {"a": 16}, {"a": 37})
    assert "differs first at step 0" in comparison.summary()


def test_other_outputs_and_other_hits_are_found(tiny_llama):
    ours = side_by_side.run_ours(tiny_llama, None, workload(), token_budget=16)
    other = copy.deepcopy(ours)
    other.requests["b"].output_token_ids[-1] += 1
    other.requests["a"].num_cached_tokens = 32
    comparison = side_by_side.compare(ours, other)
    assert comparison.outputs_differ == ["b"] and comparison.cached_tokens["a"] == (0, 32)
    assert not comparison.cached_tokens_equal and not comparison.all_equal
    shorter = copy.deepcopy(ours)
    shorter.steps.pop()
    assert not side_by_side.compare(ours, shorter).schedule_equal  # a missing last step is a difference too


def test_parting_tells_a_near_tie_from_a_clear_difference(tiny_llama):
    """The bench's ``parting``: where two engines' greedy tokens first differ, the plain HF forward's gap
    between the two tokens, against twice the dtype's bound (bf16 here, where the bound is wide)."""
    from types import SimpleNamespace

    import torch

    from prefillviz.measure.versus_vllm import parting

    model = copy.deepcopy(tiny_llama).to(torch.bfloat16)
    prompt = list(range(3, 40))
    with torch.inference_mode():
        # as parting runs it: the same bits
        logits = model(input_ids=torch.tensor([prompt + [7]]), logits_to_keep=1).logits[0, -1].float()
    order = logits.argsort(descending=True).tolist()
    gaps = [abs(float(logits[x] - logits[y])) for x, y in zip(order, order[1:])]
    close = gaps.index(min(gaps))
    loaded = SimpleNamespace(model=model, device=torch.device("cpu"), dtype=torch.bfloat16)

    def part(ours_token, vllm_token):
        ours = SimpleNamespace(requests={"a": SimpleNamespace(output_token_ids=[7, ours_token])})
        theirs = SimpleNamespace(requests={"a": SimpleNamespace(output_token_ids=[7, vllm_token])})
        return parting(loaded, [PeerRequest("a", prompt, 2)], ours, theirs, ["a"])[0]

    near, far = part(order[close], order[close + 1]), part(order[0], order[-1])
    assert near["position"] == far["position"] == 1 and (far["ours"], far["vllm"]) == (order[0], order[-1])
    assert abs(far["hf_logit_gap"] - float(logits[order[0]] - logits[order[-1]])) < 1e-6
    assert near["near_tie"] and near["hf_logit_gap"] <= 2 * near["allowed"]
    assert not far["near_tie"] and far["hf_logit_gap"] > 2 * far["allowed"]
