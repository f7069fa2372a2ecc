"""Two of the "Reproduce the papers" experiments on real vLLM, with the same token ids as ours.

    piggyback     a decode-only step of 4 users, a prompt chunk of C alone, and C-3 prompt tokens
                  with 3 users' decodes: each step's wall time (``experiments.papers_piggyback``)
    chunk cost    one prompt of N tokens at budget c (chunked) and at budget N: TTFT
                  (``experiments.papers_chunk_cost``)
    knee          one request of N tokens, prefix cache off, its time to first token: the sweep of
                  ``experiments.papers_knee`` (medians of runs, fitted the same way)
    block hits    two requests sharing a prefix of L tokens, the second arriving after the first is
                  done: its ``num_cached_tokens`` (``experiments.papers_prefix_blocks``), at the
                  worker's block size (vLLM's CPU attention: a multiple of 32)

vLLM's TTFT is read from its own token times (``peers.vllm_client``), arrival to first token.
"""

from __future__ import annotations

import statistics

from prefillviz.experiments.model_setup import token_ids_of_length
from prefillviz.experiments.papers_chunk_cost import WHOLE, ChunkCostResult, chunk_cost_points, way_name
from prefillviz.experiments.papers_knee import KneeResult, fit_knee
from prefillviz.experiments.papers_piggyback import (
    NUM_DECODES,
    NUM_PIGGYBACKED,
    SHORT_PROMPT_TOKENS,
    PiggybackResult,
)
from prefillviz.experiments.papers_prefix_blocks import BlockHit, BlockHitResult, block_prompts
from prefillviz.machine.progress import FractionProgress, ProgressCounter
from prefillviz.peers.vllm_client import VLLMWorker
from prefillviz.peers.workload import PeerRequest


def vllm_knee(
    worker: VLLMWorker, tokenizer, vocab_size: int, sizes: list[int], runs: int = 3,
    progress: FractionProgress | None = None,
) -> KneeResult:
    """TTFT of one request of N tokens on vLLM (prefix cache off), median of ``runs`` after one untimed round."""
    sizes = sorted({int(n) for n in sizes})
    counter = ProgressCounter(progress, len(sizes) * (runs + 1))
    all_runs: dict[int, list[float]] = {n: [] for n in sizes}
    for run in range(runs + 1):
        for n in sizes:
            request = PeerRequest("prompt", token_ids_of_length(tokenizer, vocab_size, n), 1)
            trace = worker.run([request], token_budget=n, prefix_caching=False, record_blocks=False)
            if run > 0:
                all_runs[n].append(trace.requests["prompt"].time_to_first_token_s * 1000)
            counter.advance(f"vLLM, N={n:,}: round {run + 1} of {runs + 1} (the first warms up)")
    medians = [statistics.median(all_runs[n]) for n in sizes]
    engine = f"vLLM {worker.versions['vllm']}"
    return KneeResult(
        engine, str(worker.versions["device"]), worker.dtype, sizes, medians, [all_runs[n] for n in sizes],
        fit_knee(sizes, medians), None, None,
    )


def vllm_cached_tokens(worker: VLLMWorker, first: list[int], second: list[int]) -> int:
    """``first``, then ``second`` once the first is done, on vLLM with its prefix cache on (reset before):
    the second's hits."""
    requests = [PeerRequest("first", first, 1), PeerRequest("second", second, 1, arrival_step=2)]
    trace = worker.run(requests, token_budget=max(len(first), len(second)), record_blocks=False)
    return trace.requests["second"].num_cached_tokens


def vllm_block_hits(
    worker: VLLMWorker, tokenizer, vocab_size: int, lengths: list[int], progress: FractionProgress | None = None
) -> BlockHitResult:
    """The second request's cached tokens on vLLM for each shared-prefix length, at the worker's block size."""
    counter = ProgressCounter(progress, len(lengths))
    points = []
    for n in lengths:
        first, second = block_prompts(tokenizer, vocab_size, n)
        points.append(BlockHit(worker.block_size, n, vllm_cached_tokens(worker, first, second)))
        counter.advance(f"vLLM, block size {worker.block_size}, shared prefix {n} tokens")
    return BlockHitResult(f"vLLM {worker.versions['vllm']}", f"vLLM {worker.versions['vllm']}", points)


def _step_ms(trace, prefill_tokens: int, decode_tokens: int) -> float:
    """The wall time of the workload's step with exactly these prompt and decode tokens (ms)."""
    step = next(
        s for s in trace.steps if s.num_prefill_tokens == prefill_tokens and s.num_decode_tokens == decode_tokens
    )
    return step.wall_time_s * 1000


def vllm_piggyback(
    worker: VLLMWorker, tokenizer, vocab_size: int, chunk_tokens: int, runs: int = 3,
    progress: FractionProgress | None = None,
) -> PiggybackResult:
    """The three steps of ``run_piggyback`` on vLLM (medians of ``runs`` after one untimed round)."""
    text = token_ids_of_length(tokenizer, vocab_size, chunk_tokens + SHORT_PROMPT_TOKENS * NUM_DECODES)
    users = [
        text[chunk_tokens + i * SHORT_PROMPT_TOKENS : chunk_tokens + (i + 1) * SHORT_PROMPT_TOKENS]
        for i in range(NUM_DECODES)
    ]
    prompt = text[: chunk_tokens - NUM_PIGGYBACKED]
    counter = ProgressCounter(progress, runs + 1)
    times: dict[str, list[float]] = {"decode-only": [], "prefill alone": [], "mixed": []}
    options = {"prefix_caching": False, "record_blocks": False}
    for run in range(runs + 1):
        decode = worker.run([PeerRequest(f"user-{i}", u, 3) for i, u in enumerate(users)], 4096, **options)
        alone = worker.run([PeerRequest("prompt", text[:chunk_tokens], 1)], chunk_tokens, **options)
        mixed_requests = [PeerRequest(f"user-{i}", u, 4) for i, u in enumerate(users[:NUM_PIGGYBACKED])] + [
            PeerRequest("prompt", prompt, 1, arrival_step=2)
        ]
        mixed = worker.run(mixed_requests, chunk_tokens, **options)
        if run > 0:
            times["decode-only"].append(_step_ms(decode, 0, NUM_DECODES))
            times["prefill alone"].append(_step_ms(alone, chunk_tokens, 0))
            times["mixed"].append(_step_ms(mixed, len(prompt), NUM_PIGGYBACKED))
        counter.advance(f"vLLM: round {run + 1} of {runs + 1} (the first warms up)")
    medians = {name: statistics.median(values) for name, values in times.items()}
    return PiggybackResult(
        f"vLLM {worker.versions['vllm']}", str(worker.versions["device"]), worker.dtype, chunk_tokens, runs,
        medians["decode-only"], medians["prefill alone"], medians["mixed"], times,
    )


def vllm_chunk_cost(
    worker: VLLMWorker, tokenizer, vocab_size: int, prompt_sizes: list[int], chunk_sizes: list[int], runs: int = 2,
    progress: FractionProgress | None = None,
) -> ChunkCostResult:
    """``run_chunk_cost`` on vLLM: each prompt whole (budget N) and at each smaller budget c, chunked prefill on."""
    plan = [(n, [WHOLE] + [c for c in sorted(set(chunk_sizes)) if c < n]) for n in sorted(set(prompt_sizes))]
    counter = ProgressCounter(progress, sum(len(ways) for _, ways in plan) * (runs + 1))
    points = []
    for n, ways in plan:
        request = PeerRequest("prompt", token_ids_of_length(tokenizer, vocab_size, n), 1)
        times: dict[int, list[float]] = {c: [] for c in ways}
        steps: dict[int, int] = {}
        for run in range(runs + 1):
            for c in ways:
                trace = worker.run([request], c or n, prefix_caching=False, record_blocks=False)
                if run > 0:
                    times[c].append(trace.requests["prompt"].time_to_first_token_s * 1000)
                steps[c] = trace.num_steps
                counter.advance(f"vLLM, N={n:,}, {way_name(c)}: round {run + 1} of {runs + 1}")
        points.extend(chunk_cost_points(n, ways, times, steps))
    return ChunkCostResult(
        f"vLLM {worker.versions['vllm']}", str(worker.versions["device"]), worker.dtype, runs, points
    )
