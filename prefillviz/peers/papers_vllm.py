"""Two of the "Reproduce the papers" experiments on real vLLM, with the same token ids as ours.

    knee          one request of N tokens, prefix cache off, its time to first token: the sweep of
                  ``experiments.papers_knee`` (medians of runs, fitted the same way)
    block hits    two requests sharing a prefix of L tokens, the second arriving after the first is
                  done: its ``num_cached_tokens`` (``experiments.papers_prefix_blocks``), at the
                  worker's block size (vLLM's CPU attention: a multiple of 32)

vLLM's TTFT is read from its own token times (``peers.vllm_client``), arrival to first token.
"""

from __future__ import annotations

import statistics

from prefillviz.engine.progress import FractionProgress, ProgressCounter
from prefillviz.experiments.model_setup import token_ids_of_length
from prefillviz.experiments.papers_knee import KneeResult, fit_knee
from prefillviz.experiments.papers_prefix_blocks import BlockHit, BlockHitResult, block_prompts
from prefillviz.peers.vllm_client import VLLMWorker
from prefillviz.peers.workload import PeerRequest


def vllm_knee(worker: VLLMWorker, tokenizer, vocab_size: int, sizes: list[int], runs: int = 3, progress: FractionProgress | None = None) -> KneeResult:
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
    return KneeResult(engine, str(worker.versions["device"]), worker.dtype, sizes, medians, [all_runs[n] for n in sizes], fit_knee(sizes, medians), None, None)


def vllm_cached_tokens(worker: VLLMWorker, first: list[int], second: list[int]) -> int:
    """``first``, then ``second`` once the first is done, on vLLM with its prefix cache on (reset before): the second's hits."""
    requests = [PeerRequest("first", first, 1), PeerRequest("second", second, 1, arrival_step=2)]
    trace = worker.run(requests, token_budget=max(len(first), len(second)), record_blocks=False)
    return trace.requests["second"].num_cached_tokens


def vllm_block_hits(worker: VLLMWorker, tokenizer, vocab_size: int, lengths: list[int], progress: FractionProgress | None = None) -> BlockHitResult:
    """The second request's cached tokens on vLLM for each shared-prefix length, at the worker's block size."""
    counter = ProgressCounter(progress, len(lengths))
    points = []
    for n in lengths:
        first, second = block_prompts(tokenizer, vocab_size, n)
        points.append(BlockHit(worker.block_size, n, vllm_cached_tokens(worker, first, second)))
        counter.advance(f"vLLM, block size {worker.block_size}, shared prefix {n} tokens")
    return BlockHitResult(f"vLLM {worker.versions['vllm']}", f"vLLM {worker.versions['vllm']}", points)
