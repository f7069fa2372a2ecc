"""Disaggregated prefill: a prefill worker and a decode worker (two real processes, gloo), the
oracle (same greedy tokens as one engine in fp32, the K/V received bit for bit as sent, the bytes
the formula says), the CLI's JSON, and the faults: a worker killed mid-transfer or a stalled
transfer is a clear error within seconds, with no process left behind and the next run working."""

import contextlib
import io
import json
import multiprocessing
import time

import numpy as np
import psutil
import pytest
import torch

from prefillviz.cli import main
from prefillviz.disagg.launch import run_disaggregated
from prefillviz.disagg.spec import DisaggError, DisaggTimeouts, model_loader
from prefillviz.experiments.chunked import ChunkedWorkload, build_workload, run_workload
from tests.tiny_models import make_tiny_llama
from tests.tolerances import MODEL_STEPS, allowed_difference, assert_within, longest_sum

BUNDLED_FP32_KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # K and V x 30 layers x 3 KV heads x head dim 64 x fp32
FAST = DisaggTimeouts(start_s=60, transfer_s=3, idle_s=20, run_s=90)


def load_tiny(device):
    """The workers' loader in the fault tests (module level: the spawned processes import it)."""
    return make_tiny_llama().to(device)


TINY_WORKLOAD = ChunkedWorkload(
    short_prompts=((1, 2, 3, 4, 5), (6, 7, 8, 9, 10, 11)), short_max_new_tokens=5, long_prompt=tuple(range(1, 41)),
    long_max_new_tokens=3, arrival_step=2, token_budget=24,
)


def worker_processes_alive() -> list[psutil.Process]:
    """Children of this test process started by multiprocessing's spawn (not its resource tracker)."""
    return [
        child for child in psutil.Process().children(recursive=True)
        if child.is_running() and child.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(child.cmdline())
    ]


def test_a_request_prefilled_by_one_engine_decodes_on_another_through_its_own_blocks(tiny_llama):
    """The engine hook alone, in one process: gather from engine A's blocks, write into B's, decode on B."""
    from prefillviz.disagg.kv_transfer import gather_request_kv, write_request_kv
    from prefillviz.engine.config import EngineConfig
    from prefillviz.engine.engine import LLMEngine
    from prefillviz.engine.errors import RequestError
    from prefillviz.engine.request import SamplingParams

    prompt, params = list(range(3, 40)), SamplingParams(max_new_tokens=6)
    whole_engine = LLMEngine(tiny_llama, None, EngineConfig(block_size=8, num_blocks=8))
    whole_engine.add_request(prompt, params, request_id="r")
    expected = whole_engine.run().requests["r"].output_token_ids

    prefill = LLMEngine(tiny_llama, None, EngineConfig(block_size=8, num_blocks=8))
    sent = prefill.add_request(prompt, SamplingParams(max_new_tokens=2), request_id="r")
    prefill.step()
    payload = gather_request_kv(prefill.kv_cache, sent.block_table, 37)  # (2, L, T, KVH, D)
    assert payload.shape == (2, 2, 37, 2, 16)

    decode = LLMEngine(tiny_llama, None, EngineConfig(block_size=8, num_blocks=12))
    decode.block_pool.allocate(3)  # so the decode engine's physical blocks differ from the prefill engine's
    received = decode.add_prefilled_request(
        prompt, sent.output_token_ids[0], params, "r", sent.arrival_time, sent.first_token_time
    )
    assert received.block_table != sent.block_table and len(received.block_table) == 5
    write_request_kv(decode.kv_cache, received.block_table, payload)
    assert torch.equal(gather_request_kv(decode.kv_cache, received.block_table, 37), payload)
    trace = decode.run()
    assert trace.requests["r"].output_token_ids == expected
    assert all(not chunk.is_prefill for step in trace.steps for chunk in step.chunks) and trace.num_steps == 5

    full = LLMEngine(tiny_llama, None, EngineConfig(block_size=8, num_blocks=12))
    full.block_pool.allocate(10)
    with pytest.raises(RequestError, match="needs 5 free KV blocks"):
        full.add_prefilled_request(prompt, 1, params, "r", 0.0, 0.0)


def test_disaggregated_run_matches_one_engine_and_moves_the_kv_bit_for_bit(bundled):
    workload = build_workload(bundled.tokenizer, 2, 8, 4, 64, 3, arrival_step=2, token_budget=24)
    run = run_disaggregated(model_loader(bundled.model_id, "float32"), workload, keep_payloads=True)
    reference = run_workload(bundled.model, workload, enable_chunked_prefill=False)

    decoded = run.decode.trace.requests
    assert {rid: r.output_token_ids for rid, r in decoded.items()} == {
        rid: r.output_token_ids for rid, r in reference.requests.items()
    }
    # the prefill worker ran whole prompts (both short ones in one step, then the long one) and
    # sampled each first token; the decode worker never ran a prompt token
    assert [[c.num_tokens for c in step.chunks] for step in run.prefill.trace.steps] == [[8, 8], [64]]
    assert all(not c.is_prefill and c.num_tokens == 1 for step in run.decode.trace.steps for c in step.chunks)
    assert run.prefill.num_threads == run.decode.num_threads == max(1, len(psutil.Process().cpu_affinity()) // 2)

    transfers = {t.request_id: t for t in run.transfers}
    assert list(transfers) == ["short-1", "short-2", "long"]
    for rid, transfer in transfers.items():
        num_prompt_tokens = len(reference.requests[rid].prompt_token_ids)
        assert transfer.num_tokens == num_prompt_tokens
        assert transfer.num_bytes == BUNDLED_FP32_KV_BYTES_PER_TOKEN * num_prompt_tokens == (
            run.prefill.payloads[rid].size
        )
        assert np.array_equal(run.prefill.payloads[rid], run.decode.payloads[rid])  # bit for bit
        assert transfer.bit_identical and 0 < transfer.transfer_s < 5
        assert transfer.send_start_time < transfer.recv_end_time <= transfer.written_time

    # what was sent is the prompt's K/V as the plain HF forward computes it: (2, L, T, KVH, D)
    sent = torch.from_numpy(run.prefill.payloads["long"].copy()).view(torch.float32).view(2, 30, 64, 3, 64)
    with torch.inference_mode():
        cache = bundled.model(torch.tensor([workload.long_prompt]), use_cache=True).past_key_values
    for layer in (0, 29):
        hf_keys, hf_values = (
            cache.layers[layer].keys[0].transpose(0, 1), cache.layers[layer].values[0].transpose(0, 1)  # (T, KVH, D)
        )
        # two forwards: the engine's and HF's
        for got, want in ((sent[0, layer], hf_keys), (sent[1, layer], hf_values)):
            assert_within(
                got, want, allowed_difference(torch.float32, want, MODEL_STEPS, longest_sum(bundled.model, 64)),
                f"layer {layer}",
            )
    assert not worker_processes_alive()


def test_cli_disagg_json_has_the_three_setups(bundled):
    out = io.StringIO()
    arguments = [
        "disagg", "--json", "--dtype", "float32", "--num-short", "2", "--short-prompt-tokens", "8",
        "--short-new-tokens", "4",
    ]
    with contextlib.redirect_stdout(out):
        assert main([*arguments, "--long-prompt-tokens", "64", "--long-new-tokens", "3", "--token-budget", "24"]) == 0
    result = json.loads(out.getvalue())
    assert (
        result["outputs_equal"] is True and result["kv_bit_identical"] is True
        and result["kv_bytes_match_formula"] is True
    )
    assert result["kv_bytes_per_token"] == BUNDLED_FP32_KV_BYTES_PER_TOKEN
    assert result["kv_bytes_sent"] == BUNDLED_FP32_KV_BYTES_PER_TOKEN * (8 + 8 + 64)
    assert 0 < result["transfer_s_median"] < 5 and result["transfer_gb_s"] > 0
    assert set(result["setups"]) == {"one_engine_chunking_off", "one_engine_chunking_on", "disaggregated"}
    for setup in result["setups"].values():
        assert 0 < setup["itl_p50_ms"] <= setup["itl_max_ms"] < 60_000 and 0 < setup["ttft_long_ms"] < 60_000
    # chunking off runs the 64-token prompt in one step that pauses both decodes
    assert result["setups"]["one_engine_chunking_off"]["num_paused_decode_steps"] >= 1
    assert result["setups"]["disaggregated"]["num_paused_decode_steps"] == 0
    assert result["threads"]["prefill_worker"] == result["threads"]["decode_worker"] == max(1, result["cores"] // 2)


@pytest.mark.parametrize(
    "fault, message",
    [
        ("decode_killed_mid_transfer", "The decode worker died"),
        ("transfer_stalls", "did not complete within 3 s: the other worker stalled"),
    ],
)
def test_a_worker_killed_or_stalled_mid_transfer_is_an_error_in_bounded_time_and_nothing_is_left(fault, message):
    start = time.perf_counter()
    with pytest.raises(DisaggError, match=message) as raised:
        run_disaggregated(load_tiny, TINY_WORKLOAD, timeouts=FAST, fault=fault)
    assert time.perf_counter() - start < 45  # spawn + imports + the 3 s transfer timeout, never the 90 s deadline
    assert "nothing is left running" in str(raised.value)
    assert not multiprocessing.active_children() and not worker_processes_alive()


def test_the_prefill_worker_killed_mid_transfer_is_an_error_and_the_next_run_works():
    start = time.perf_counter()
    with pytest.raises(
        DisaggError, match=r"The prefill worker died mid-run \(killed by SIGKILL\)\. The decode worker was stopped"
    ):
        run_disaggregated(load_tiny, TINY_WORKLOAD, timeouts=FAST, fault="prefill_killed_mid_transfer")
    assert time.perf_counter() - start < 45
    assert not multiprocessing.active_children() and not worker_processes_alive()
    run = run_disaggregated(load_tiny, TINY_WORKLOAD, timeouts=FAST)
    reference = run_workload(make_tiny_llama(), TINY_WORKLOAD, enable_chunked_prefill=False)
    assert {rid: r.output_token_ids for rid, r in run.decode.trace.requests.items()} == {
        rid: r.output_token_ids for rid, r in reference.requests.items()
    }
    assert all(t.bit_identical for t in run.transfers) and not worker_processes_alive()


def test_the_lesson_step_measures_every_number_and_its_question_gets_a_reveal(bundled):
    from prefillviz import lessons

    step = next(step for lesson in lessons.load_lessons() for step in lesson.steps if step.action["kind"] == "disagg")
    outcome = lessons.run_action(bundled, step.action, scale=0.05)
    assert set(outcome.measured) == set(lessons.ACTION_KINDS["disagg"].measured) and (
        outcome.measured["outputs_identical"] == 1.0
    )
    long_tokens = len(outcome.raw["disagg"].workload.long_prompt)
    assert outcome.measured["kv_mb_sent_long"] == BUNDLED_FP32_KV_BYTES_PER_TOKEN * long_tokens / 1e6
    # a ratio of two measured gaps (its value is the lesson's question)
    assert 0.5 < outcome.measured["disagg_itl_growth"] < 50
    reveal = lessons.format_reveal(step.question, outcome.measured[step.question.answer], 0)
    assert reveal.measured_text and reveal.verdict and lessons.step_figure(step, outcome).data
    assert lessons.page_results(outcome, "label")["disagg"]["comparison"] is outcome.raw["disagg"]
