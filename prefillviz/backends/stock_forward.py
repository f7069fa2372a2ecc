"""For a model the engine's own forward does not know: the stock ``transformers`` forward, the engine's
paged attention inside it (the measured backend's ``stock_forward``).

``paged_attention_forward`` is registered under one name in both ``AttentionInterface`` (the
function) and ``AttentionMaskInterface`` (a mask builder that returns None: the engine knows each
request's causal structure from its metadata). With only the first, transformers would build its
own mask for the packed batch, which is wrong for chunked prefill. Without engine metadata (a plain
HF call on the same model) it is SDPA, so one loaded model serves both the engine and the oracle.
Its linears are the model's own modules; its spans come from module hooks (``instrument.capture``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from prefillviz.backends.shared_settings import shared_setting
from prefillviz.engine.attention import AttentionMetadata

ATTENTION_NAME = "prefillviz_paged"


def stock_forward(model: torch.nn.Module, inputs: dict, ops, observer=None) -> torch.Tensor:
    """One engine step through the model's own forward, ``ops``' attention inside; logits (num_kept, V)."""
    meta = inputs["prefillviz_metadata"]
    meta.ops, meta.observer = ops, observer if observer is not None and observer.sees_tensors else None
    with engine_attention(model):
        return model(**inputs).logits[0]


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
    """The attention function of the stock forward: the step's K/V into the cache, then the step's attention."""
    meta = prefillviz_metadata
    if meta is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (T, heads, D)
    meta.kv_cache.write(module.layer_idx, meta.slot_mapping, k, v)
    if meta.observer is not None:
        meta.observer.attention(module.layer_idx, module, q, k, v, meta)
    out = meta.ops.attention(module.layer_idx, q, k, v, scale, meta)
    return out.view(1, q.shape[0], q.shape[1], q.shape[2]), None  # (1, T, H, D)


def no_mask(*args, **kwargs) -> None:
    """Mask builder for ATTENTION_NAME: the attention function derives causality itself."""
    return None


AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
AttentionMaskInterface.register(ATTENTION_NAME, no_mask)


@contextmanager
def engine_attention(model: torch.nn.Module) -> Iterator[None]:
    """Route the model's attention through ``paged_attention_forward`` inside the block.

    The model's config is shared by every thread, so this is a ``shared_setting``: set by the
    first thread in, restored by the last one out (even on error). A plain call meanwhile passes
    no engine metadata and gets SDPA with no mask, which is causal: an unpadded forward computes
    as the stock model does.
    """
    config = model.config

    def apply() -> Callable[[], None]:
        previous = config._attn_implementation
        config._attn_implementation = ATTENTION_NAME
        return lambda: setattr(config, "_attn_implementation", previous)

    with shared_setting(model, "attention", apply):
        yield
