"""The attention function the engine puts inside a stock ``transformers`` model.

Registered under one name in both ``AttentionInterface`` (the function) and
``AttentionMaskInterface`` (a mask builder that returns None: the engine knows each
request's causal structure from its own metadata, so no (T, T) mask is built). With only
the first registration, transformers would still build and pass its own mask for a packed
batch, which is wrong for chunked prefill.

For each layer it:
1. writes the step's new K/V into the paged cache through the slot mapping (the KV writes);
2. for each request packed in the batch, attends its queries over the request's cached +
   new keys (gathered through its block table), causally, offset by what was cached:

       keys  ->  0 .......... context_len
       query i (position num_computed + i) sees keys 0 .. num_computed + i

Without engine metadata (a plain HF call on the same model) it falls back to SDPA, so one
loaded model serves both the engine and the oracle.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from prefillviz.engine.kv_cache import PagedKVCache

ATTENTION_NAME = "prefillviz_paged"


@dataclass
class AttentionMetadata:
    """Where each request's queries sit in the packed batch and where its K/V live."""

    kv_cache: PagedKVCache
    slot_mapping: torch.Tensor  # (T,) cache slot of every scheduled token
    query_start_loc: list[int]  # request r's queries are batch rows [q[r], q[r+1])
    num_computed_tokens: list[int]  # per request: tokens already cached before this step
    context_slots: list[torch.Tensor | None]  # per request: slots of positions 0..context_len-1
    request_ids: list[str] = field(default_factory=list)  # per request, batch order
    positions: torch.Tensor | None = None  # (T,) on CPU: each token's position in its request
    # observers see (layer_idx, module, query, key, value, metadata) after the write; the
    # instruments (timers, KV write log, query capture) attach here
    observers: list[Callable] = field(default_factory=list)


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # (1, H, T, D), post-RoPE
    key: torch.Tensor,  # (1, KVH, T, D)
    value: torch.Tensor,  # (1, KVH, T, D)
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    prefillviz_metadata: AttentionMetadata | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    meta = prefillviz_metadata
    if meta is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    layer_idx = module.layer_idx
    new_key = key[0].transpose(0, 1)  # (T, KVH, D)
    new_value = value[0].transpose(0, 1)
    meta.kv_cache.write(layer_idx, meta.slot_mapping, new_key, new_value)
    for observer in meta.observers:
        observer(layer_idx, module, query, key, value, meta)

    enable_gqa = query.shape[1] != key.shape[1]
    outputs = []
    for r, num_computed in enumerate(meta.num_computed_tokens):
        start, end = meta.query_start_loc[r], meta.query_start_loc[r + 1]
        q = query[:, :, start:end]  # (1, H, q, D)
        if num_computed == 0:  # nothing cached: the context is exactly the new tokens
            k, v = key[:, :, start:end], value[:, :, start:end]
        else:
            k, v = meta.kv_cache.gather(layer_idx, meta.context_slots[r])
            k, v = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)  # (1, KVH, ctx, D)
        q_len, kv_len = q.shape[2], k.shape[2]
        mask, is_causal = None, False
        if q_len > 1 and kv_len == q_len:
            is_causal = True
        elif q_len > 1:  # a chunk after cached context: causal, shifted by num_computed
            rows = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)
            mask = torch.arange(kv_len, device=q.device)[None, :] <= rows  # (q, kv) True = attend
        outputs.append(
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scaling, enable_gqa=enable_gqa)
        )
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)  # (1, H, T, D)
    return out.transpose(1, 2).contiguous(), None


def no_mask(*args, **kwargs) -> None:
    """Mask builder for ATTENTION_NAME: the attention function derives causality itself."""
    return None


AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
AttentionMaskInterface.register(ATTENTION_NAME, no_mask)


@contextmanager
def engine_attention(model: torch.nn.Module) -> Iterator[None]:
    """Route the model's attention through ``paged_attention_forward``; restore it after, even on error."""
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
