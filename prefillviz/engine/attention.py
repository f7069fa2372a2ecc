"""A step's attention metadata: what the runner builds once a step and every layer reads.

The KV cache, each token's slot, where each request's rows start in the packed batch and what
it had cached before; ``attend`` runs one layer's attention over it with a kernel of
``paged_attention.py``'s signature and returns every row, or only the rows whose logits are kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

from prefillviz.engine.kv_cache import PagedKVCache
from prefillviz.engine.paged_attention import PagedStep


@dataclass
class AttentionMetadata:
    """Where each request's queries sit in the packed batch and where its K/V live."""

    kv_cache: PagedKVCache
    slot_mapping: torch.Tensor  # (T,) cache slot of every scheduled token
    query_start_loc: list[int]  # request r's queries are batch rows [q[r], q[r+1])
    num_computed_tokens: list[int]  # per request: tokens already cached before this step
    context_slots: list[torch.Tensor | None]  # per request: slots of positions 0..context_len-1
    request_ids: list[str]  # per request, batch order
    positions: torch.Tensor  # (T,) on CPU: each token's position in its request
    ops: object = None  # the step's ``StepOps`` and inspecting observer: a stock forward's attention reads them
    observer: object = None

    @cached_property
    def step(self) -> PagedStep:
        """The step as the attention kernels take it (made once, used by every layer)."""
        return PagedStep(self.query_start_loc, self.num_computed_tokens, self.slot_mapping, self.context_slots)

    def attend(self, layer: int, q, k, v, scale: float, kernel: Callable, keep: torch.Tensor | None = None):
        """One layer's attention with ``kernel`` (``paged_attention``'s signature): q (T, H, D), k and v
        (T, KVH, D), already in the cache -> (T, H D); with ``keep`` -> those rows only, (kept, H D)."""
        keys, values = self.kv_cache.key_cache[layer], self.kv_cache.value_cache[layer]
        out = kernel(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), keys, values, self.step, scale)
        out = out.transpose(0, 1).reshape(q.shape[0], -1)  # (H, T, D) -> (T, H D)
        return out.index_select(0, keep) if keep is not None else out
