"""Tiny random models for the engine and loader tests (no download)."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def make_tiny_llama(**config_overrides) -> LlamaForCausalLM:
    """A 2-layer Llama with GQA (4 heads, 2 KV heads), weights peaked enough for stable greedy
    (seed 0); ``config_overrides`` change its config (e.g. a smaller vocabulary)."""
    torch.manual_seed(0)
    config = dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, attn_implementation="sdpa",
    )
    return LlamaForCausalLM(LlamaConfig(**{**config, **config_overrides})).eval()
