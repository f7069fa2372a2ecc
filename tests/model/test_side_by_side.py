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
