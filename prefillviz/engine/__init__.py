"""The engine: a small vLLM-style serving engine in plain torch, the thing prefillviz teaches.

Read it in this order (request -> scheduler -> blocks -> cache -> runner -> forward -> attention -> sampler):

    request.py          Request: token ids, num_computed_tokens, block table, status; SamplingParams
    config.py           EngineConfig: block size, token budget, chunking, prefix caching, KV memory
    block_pool.py       KV blocks: ref counts, chained prefix hashes, the LRU free queue
    scheduler.py        each step: up to token_budget tokens, decodes first, chunks, prefix hits
    kv_cache.py         the paged K/V tensors per layer, written through the slot mapping
    runner.py           one step: pack every scheduled token into one batch, forward, sample
    forward.py          the layers of a Llama-shaped model, each op from the step's backend
    backend.py          the Backend seam, and TorchBackend: every op in plain torch
    paged_attention.py  attention over the paged cache: the naive oracle and the SDPA version
    sparse_attention.py block-sparse prefill (XAttention): score the tiles, keep some, attend to those
    attention.py        the step's attention metadata, read by every layer
    sampler.py          greedy, temperature, top-k, top-p; the first token's distribution
    engine.py           LLMEngine: add_request, step, run -> Trace

and what they share: trace.py (what a run leaves), observer.py (how an instrument watches a run),
request_checks.py, errors.py and clock.py. It imports nothing else of prefillviz; ``prefillviz/backends/`` is
the speed lab that can stand in for backend.py's ops.
"""
