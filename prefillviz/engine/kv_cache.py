"""Paged K/V storage: one pair of tensors per layer, addressed by slot.

    layer l:  K[l], V[l]  shape (num_blocks, block_size, num_kv_heads, head_dim)
    slot = block_id * block_size + offset_in_block

The runner turns each scheduled token's position into a slot through the request's block
table (the *slot mapping*); the attention function writes the new K/V there, and the
kernels in ``prefillviz/kernels/paged_attention.py`` gather a request's whole context back through
the same table.
"""

from __future__ import annotations

import torch


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """The KV cache of one token: 2 (K and V) x layers x kv_heads x head_dim x bytes per element.

    The one place this formula is written (``ModelShape``, the memory report and the KV write log use it).
    """
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


class PagedKVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # torch.empty: pages are only committed when a block is first written
        self.key_cache = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.value_cache = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def num_bytes(self) -> int:
        return sum(t.nelement() * t.element_size() for t in self.key_cache + self.value_cache)

    def write(self, layer_idx: int, slot_mapping: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Store new K/V. ``key``/``value``: (T, num_kv_heads, head_dim); ``slot_mapping``: (T,)."""
        self.key_cache[layer_idx].view(-1, *key.shape[1:]).index_copy_(0, slot_mapping, key)
        self.value_cache[layer_idx].view(-1, *value.shape[1:]).index_copy_(0, slot_mapping, value)
