"""Reference kernels, llm.c ``dev/cuda`` style: one file per kernel family, the naive
version first as the oracle, every faster version checked against it before it is timed.

    attention.py               one causal (GQA-aware) prompt: v1 naive, v2 torch SDPA,
                               v3 blocked online softmax
    paged_attention.py         one engine step over the paged KV cache: v1 naive, v2 loop,
                               v3 packed block-diagonal mask, v4 FlexAttention, v5 Triton,
                               v6 loop with fp32 decodes (the engine's)
    paged_attention_triton.py  v5's Triton kernel (CUDA; the CPU checks it under TRITON_INTERPRET=1)

``python -m prefillviz kernels`` times every version vs N (``prefillviz/measure/kernel_bench.py``).
"""
