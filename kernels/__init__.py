"""Reference kernels, llm.c ``dev/cuda`` style: one file per kernel family, the naive
version first as the oracle, every faster version checked against it before it is timed.

    attention.py   causal (GQA-aware) attention: v1 naive, v2 torch SDPA, v3 blocked online softmax
"""
