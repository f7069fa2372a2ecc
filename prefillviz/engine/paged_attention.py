"""Attention of one step over the paged KV cache, in plain torch: the oracle and the SDPA version.

One step packs several requests into one batch (fresh prompts, chunks after cached context,
decodes). Every attention the engine can run has one signature:

    out = attention(q, k_new, v_new, key_cache, value_cache, step, scale)
        q             (H, T, D)    post-RoPE queries of the step's T new tokens, requests packed
        k_new, v_new  (KVH, T, D)  the step's new keys and values (already in the cache)
        key_cache,    (num_blocks, block_size, KVH, D): one layer's paged K and V
        value_cache
        step          PagedStep: where each request's rows start, what it had cached, and the
                      cache slots of its whole context
        out           (H, T, D)    query i of request r (position num_computed[r] + i) attends
                                   keys 0 .. num_computed[r] + i of its own request only

    request r's keys:  0 ............ num_computed[r] | num_computed[r] ... context_len(r) - 1
                       (cached in earlier steps)      | (written by this step)

``paged_naive`` is the oracle every other version is checked against. ``paged_sdpa`` is what the
textbook backend runs: one ``scaled_dot_product_attention`` call per request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PagedStep:
    """Where each request of a step sits in the packed batch and in the cache."""

    query_start_loc: list[int]  # R + 1 offsets: request r's new tokens are rows [s[r], s[r + 1])
    num_computed: list[int]  # per request, tokens already cached before this step
    slot_mapping: torch.Tensor  # (T,) cache slot of every new token (block * block_size + offset)
    context_slots: list[torch.Tensor | None]  # per request, slots of positions 0 .. context_len - 1 (None: no cache)
    _kept: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def kept(self, key: tuple, make: Callable[[], object]):
        """``make()``, made once per step and kept on it: every layer of the step asks for the same."""
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]

    @property
    def num_requests(self) -> int:
        return len(self.num_computed)

    def query_len(self, r: int) -> int:
        return self.query_start_loc[r + 1] - self.query_start_loc[r]

    def context_len(self, r: int) -> int:
        return self.num_computed[r] + self.query_len(r)

    def slots(self, r: int) -> torch.Tensor:
        """Cache slots of request r's positions 0 .. context_len - 1."""
        slots = self.context_slots[r]
        return self.slot_mapping[self.query_start_loc[r] : self.query_start_loc[r + 1]] if slots is None else slots

    def packed_slots(self) -> torch.Tensor:
        """Slots of every request's whole context, request after request: (S,)."""
        return torch.cat([self.slots(r) for r in range(self.num_requests)])


def gather(cache_tensor: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """(n, KVH, D) rows of a (num_blocks, block_size, KVH, D) cache at ``slots``, as (KVH, n, D)."""
    return cache_tensor.view(-1, *cache_tensor.shape[2:]).index_select(0, slots).transpose(0, 1)


def context(cache_tensor: torch.Tensor, step: PagedStep, r: int) -> torch.Tensor:
    """Request r's keys (or values) as (KVH, ctx, D): read in place where its slots are one run (as a fresh
    engine allocates them), else gathered. The same numbers either way."""
    first = consecutive_from(step, r)
    if first is None:
        return gather(cache_tensor, step.slots(r))
    return cache_tensor.view(-1, *cache_tensor.shape[2:])[first : first + step.context_len(r)].transpose(0, 1)


def consecutive_from(step: PagedStep, r: int) -> int | None:
    """The first slot of request r's context when its slots are consecutive, else None (once per step)."""

    def first() -> int | None:
        slots = step.slots(r)
        if len(slots) == 0 or int(slots[-1]) - int(slots[0]) != len(slots) - 1 or not bool((slots.diff() == 1).all()):
            return None
        return int(slots[0])

    return step.kept(("consecutive_from", r), first)


def paged_naive(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float, row_block: int | None = None):
    """The oracle: per request, the full (H, q, ctx) scores, masked, softmax, times V (``row_block`` query rows
    at a time, if given: the kernel checks' long prompts fit in memory; a row's arithmetic is the same)."""
    num_heads = q.shape[0]
    outputs = []
    for r in range(step.num_requests):
        k = gather(key_cache, step.slots(r))  # (KVH, ctx, D)
        v = gather(value_cache, step.slots(r))
        groups = num_heads // k.shape[0]  # GQA: query head h reads KV head h // groups
        k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)  # (H, ctx, D)
        start, q_len, ctx = step.query_start_loc[r], step.query_len(r), step.context_len(r)
        block = row_block or q_len
        for row in range(0, q_len, block):
            rows = min(block, q_len - row)
            scores = (q[:, start + row : start + row + rows] @ k.transpose(-1, -2)) * scale  # (H, rows, ctx)
            query_position = torch.arange(rows, device=q.device)[:, None] + (ctx - q_len + row)
            future = torch.arange(ctx, device=q.device)[None, :] > query_position  # key after the query
            probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            outputs.append(probs @ v)  # (H, rows, D)
    return torch.cat(outputs, dim=1)


def paged_sdpa(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """One torch SDPA call per request: causal for a fresh prompt (its keys are exactly the new
    ones), an offset causal mask for a chunk after cached context, no mask for a decode."""
    enable_gqa = q.shape[0] != k_new.shape[0]
    outputs = []
    for r, num_computed in enumerate(step.num_computed):
        start, end = step.query_start_loc[r], step.query_start_loc[r + 1]
        if num_computed == 0:  # nothing cached: the context is exactly the new tokens
            k, v = k_new[:, start:end], v_new[:, start:end]
        else:
            k, v = context(key_cache, step, r), context(value_cache, step, r)  # (KVH, ctx, D)
        q_len, kv_len = end - start, k.shape[1]
        mask = offset_mask(step, r, q.dtype, q.device) if 1 < q_len < kv_len else None
        out = F.scaled_dot_product_attention(q[None, :, start:end], k[None], v[None], attn_mask=mask,
                                             is_causal=1 < q_len == kv_len, scale=scale, enable_gqa=enable_gqa)
        outputs.append(out[0])
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


def offset_mask(step: PagedStep, r: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Request r's chunk after its cached context: (q, kv), 0 where a query attends a key (its position or
    before), -inf elsewhere, in q's dtype (what SDPA makes of a bool mask); once per step."""

    def mask() -> torch.Tensor:
        q_len, kv_len = step.query_len(r), step.context_len(r)
        rows = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
        attend = torch.arange(kv_len, device=device)[None, :] <= rows
        return torch.zeros(q_len, kv_len, dtype=dtype, device=device).masked_fill_(~attend, float("-inf"))

    return step.kept(("offset_mask", r, dtype, device), mask)
