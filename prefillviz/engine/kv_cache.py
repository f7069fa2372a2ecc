"""Paged K/V storage: one pair of tensors per layer, addressed by slot.

    layer l:  K[l], V[l]  shape (num_blocks, block_size, num_kv_heads, head_dim)
    slot = block_id * block_size + offset_in_block

The runner turns each scheduled token's position into a slot through the request's block
table (the *slot mapping*); each layer writes its new K/V there (the KV writes), and attention
reads a request's whole context back through the same table (``paged_attention.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """The KV cache of one token: 2 (K and V) x layers x kv_heads x head_dim x bytes (the formula's one place)."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def cache_shape(config) -> tuple[int, int, int]:
    """(layers, KV heads, head size) of a transformers config: one token's K/V in every layer."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    return config.num_hidden_layers, getattr(config, "num_key_value_heads", None) or num_heads, head_dim


def empty_kv_cache(num_layers: int, shape: tuple, dtype: torch.dtype, device: torch.device) -> tuple[list, list]:
    """Per layer, a K and a V tensor of ``shape``: ``torch.empty`` commits a page only when a block is first written."""
    return tuple([torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)] for _ in "kv")


class PagedKVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, allocate: Callable = empty_kv_cache) -> None:
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.key_cache, self.value_cache = allocate(num_layers, shape, dtype, torch.device(device))

    @property
    def num_bytes(self) -> int:
        return sum(t.nelement() * t.element_size() for t in self.key_cache + self.value_cache)

    def write(self, layer_idx: int, slot_mapping: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Store new K/V. ``key``/``value``: (T, num_kv_heads, head_dim); ``slot_mapping``: (T,)."""
        self.key_cache[layer_idx].view(-1, *key.shape[1:]).index_copy_(0, slot_mapping, key)
        self.value_cache[layer_idx].view(-1, *value.shape[1:]).index_copy_(0, slot_mapping, value)
