"""The bench's peer: our engine against transformers' own continuous batching.

One mixed workload (prompts of several lengths, a few new tokens each, greedy) through
``LLMEngine`` and through ``model.generate_batch``, the runs interleaved; both do the same
tokens, so the speed-up is a ratio of wall times, and the outputs are compared token for token.
"""

from __future__ import annotations

import statistics

from prefillviz.engine.request import SamplingParams
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.loading.prompts import bench_token_ids
from prefillviz.machine.timers import median_and_spread, run_timed


def engine_over_hf_cb(
    loaded, num_tokens: int, prompt_lengths: tuple[int, ...], new_tokens: int, rounds: int, cache_blocks: int | None
) -> dict:
    """Our engine vs transformers' own continuous batching (``generate_batch``) on one mixed workload.

    ``prompt_lengths`` (8 requests, 64 ... 1,024 tokens in full) scaled by N / 512,
    ``new_tokens`` new tokens each (32), token budget 512, greedy, timed ``rounds`` times each.
    Both do the same tokens, so the speed-up is a ratio of wall times. ``cache_blocks`` caps HF's
    paged cache (quick); None lets HF size one from the free memory, which takes seconds.
    """
    from transformers import ContinuousBatchingConfig, GenerationConfig

    token_budget = 512
    scale = num_tokens / 512
    lengths = [max(8, int(n * scale)) for n in prompt_lengths]
    prompts = [bench_token_ids(loaded.tokenizer, n + 7 * i)[7 * i :] for i, n in enumerate(lengths)]

    def ours() -> list[list[int]]:
        engine = one_request_engine(loaded.model, loaded.tokenizer, token_budget)  # a fresh engine, prefix cache off
        ids = [engine.add_request(p, SamplingParams(max_new_tokens=new_tokens)).request_id for p in prompts]
        trace = engine.run()
        return [trace.requests[i].output_token_ids for i in ids]

    cache_config = (None if cache_blocks is None
                    else ContinuousBatchingConfig(num_blocks=cache_blocks, max_batch_tokens=token_budget))

    def theirs() -> list[list[int]]:
        config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
        outputs = loaded.model.generate_batch(inputs=prompts, generation_config=config,
                                              continuous_batching_config=cache_config, progress_bar=False)
        by_prompt = {tuple(o.prompt_ids): list(o.generated_tokens)[:new_tokens] for o in outputs.values()}
        return [by_prompt[tuple(p)] for p in prompts]

    ours_out, theirs_out = ours(), theirs()  # warm-up, and the outputs compared
    ours_s, theirs_s = [], []
    for _ in range(rounds):
        ours_s.append(run_timed(ours, loaded.device)[0])
        theirs_s.append(run_timed(theirs, loaded.device)[0])
    num_tokens_done = sum(lengths) + len(prompts) * new_tokens
    return {
        "prompt_lengths": lengths,
        "new_tokens": new_tokens,
        "engine_tok_s": num_tokens_done / statistics.median(ours_s),
        "hf_generate_batch_tok_s": num_tokens_done / statistics.median(theirs_s),
        "speedup": statistics.median(theirs_s) / statistics.median(ours_s),
        "outputs_equal": sum(a == b for a, b in zip(ours_out, theirs_out)),
        "outputs_compared": len(prompts),
        "engine_s": median_and_spread(ours_s),
        "hf_generate_batch_s": median_and_spread(theirs_s),
    }
